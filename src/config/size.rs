//! Sizes in bytes, for `#[serde(deserialize_with)]`: an integer, or a
//! string with a unit, `"256MiB"`, `"64KiB"`, `"1GB"` (the `bytesize`
//! crate's syntax, parsed here rather than adding a dependency for a few
//! lines). KB, MB, GB, TB are powers of 1000; KiB, MiB, GiB, TiB of 1024.
//! The error quotes the value and names the units; the loader adds the key.

use serde::Deserializer;

/// Units and their sizes in bytes. Upper-cased for the comparison.
const UNITS: &[(&str, u64)] = &[
    ("B", 1),
    ("KB", 1_000),
    ("MB", 1_000_000),
    ("GB", 1_000_000_000),
    ("TB", 1_000_000_000_000),
    ("KIB", 1 << 10),
    ("MIB", 1 << 20),
    ("GIB", 1 << 30),
    ("TIB", 1 << 40),
];

/// Why a size does not parse.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SizeError {
    #[error("invalid size {0:?}: expected bytes as an integer, or a whole number and a unit, e.g. \"256MiB\", \"64KiB\", \"1GB\"")]
    Shape(String),
    #[error("invalid size {given:?}: unknown unit {unit:?} (units: B, KB, MB, GB, TB, KiB, MiB, GiB, TiB)")]
    Unit { given: String, unit: String },
    #[error("invalid size {0:?}: too large")]
    Overflow(String),
}

/// Parses `"256MiB"`, `"64 KiB"`, `"1GB"` or `"1048576"` to bytes.
pub fn parse_size(text: &str) -> Result<u64, SizeError> {
    let s = text.trim();
    let digits = s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
    let (number, unit) = s.split_at(digits);
    let n: u64 = number
        .parse()
        .map_err(|_| SizeError::Shape(text.to_owned()))?;
    let unit = unit.trim();
    if unit.is_empty() {
        return Ok(n);
    }
    let (_, scale) = UNITS
        .iter()
        .find(|(u, _)| u.eq_ignore_ascii_case(unit))
        .ok_or_else(|| SizeError::Unit {
            given: text.to_owned(),
            unit: unit.to_owned(),
        })?;
    n.checked_mul(*scale)
        .ok_or_else(|| SizeError::Overflow(text.to_owned()))
}

/// One size in bytes, as a `usize`: an integer, or a string the way
/// [`parse_size`] reads it.
pub(super) fn human_size<'de, D: Deserializer<'de>>(d: D) -> Result<usize, D::Error> {
    d.deserialize_any(SizeVisitor)
}

struct SizeVisitor;

impl serde::de::Visitor<'_> for SizeVisitor {
    type Value = usize;

    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("a size in bytes: an integer, or a string such as \"256MiB\"")
    }

    fn visit_u64<E: serde::de::Error>(self, n: u64) -> Result<usize, E> {
        usize::try_from(n).map_err(|_| E::custom(SizeError::Overflow(n.to_string())))
    }

    fn visit_i64<E: serde::de::Error>(self, n: i64) -> Result<usize, E> {
        let n = u64::try_from(n).map_err(|_| E::custom(SizeError::Shape(n.to_string())))?;
        self.visit_u64(n)
    }

    fn visit_str<E: serde::de::Error>(self, s: &str) -> Result<usize, E> {
        self.visit_u64(parse_size(s).map_err(E::custom)?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes() {
        let rows: [(u32, &str, Result<u64, &str>); 12] = [
            (1, "1048576", Ok(1_048_576)),
            (2, "256MiB", Ok(268_435_456)),
            (3, "64KiB", Ok(65_536)),
            (4, "1GB", Ok(1_000_000_000)),
            (5, "64 kib", Ok(65_536)),
            (6, " 2GiB ", Ok(2 << 30)),
            (7, "10B", Ok(10)),
            (8, "12 parsecs", Err("unknown unit \"parsecs\"")),
            (9, "MiB", Err("expected bytes as an integer")),
            (10, "1.5GiB", Err("unknown unit \".5GiB\"")),
            (11, "-1", Err("expected bytes as an integer")),
            (12, "99999999999TiB", Err("too large")),
        ];
        for (row, text, want) in rows {
            match (parse_size(text), want) {
                (Ok(got), Ok(want)) => assert_eq!(got, want, "row {row}: {text}"),
                (Err(e), Err(want)) => {
                    assert!(e.to_string().contains(want), "row {row}: {text}: {e}")
                }
                (got, want) => panic!("row {row}: {text}: got {got:?}, want {want:?}"),
            }
        }
    }
}
