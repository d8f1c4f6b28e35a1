//! The finished records above a committed offset, as the commit's metadata
//! carries them to the partition's next owner (pure, no rdkafka).
//!
//! A Kafka commit says "every record before this offset is finished". Jobs
//! finish out of order, so a waiting job at a partition's head holds back
//! records finished above it; the metadata names them, and the next owner
//! finishes them on receipt instead of calling the downstream again.
//!
//! Kafka limits metadata (`offset.metadata.max.bytes`, 4096 by default), so
//! the encoding must be dense. Two are written, whichever is shorter, as
//! parallel-consumer does:
//!
//! - `tw2:r…`: run lengths. Per range, the count of unfinished offsets
//!   before it and its length, as LEB128 varints, in URL-safe base64. Dense
//!   for a few long ranges over a wide span.
//! - `tw2:b…`: a bitset of the offsets after the commit, one bit each, in
//!   URL-safe base64. Dense for many short ranges (a backlogged seller's
//!   waiting jobs between light sellers' finished ones): 3,000 bytes name
//!   18,000 offsets whatever their pattern.
//!
//! What still does not fit is cut from the top: those records are called
//! again (at-least-once). `tw1:` (text ranges, `3-5,9`), written by
//! earlier releases, is still read.

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine as _;

/// Longest commit metadata written; Kafka's default limit
/// (`offset.metadata.max.bytes`) is 4096.
pub const MAX_METADATA: usize = 3000;

const V1: &str = "tw1:";
const RUNS: &str = "tw2:r";
const BITS: &str = "tw2:b";

/// Inclusive offset ranges, ascending and disjoint.
pub type Ranges = Vec<(i64, i64)>;

/// The metadata naming `done` (ascending, disjoint, every offset above
/// `base`), cut at [`MAX_METADATA`]; empty when `done` is.
pub fn encode(base: i64, done: &[(i64, i64)]) -> String {
    if done.is_empty() {
        return String::new();
    }
    let runs = runs(base, done);
    let bits = bits(base, done);
    // The one that names more; of two that name all, the shorter.
    let pick = if runs.through != bits.through {
        if runs.through > bits.through {
            runs
        } else {
            bits
        }
    } else if runs.text.len() <= bits.text.len() {
        runs
    } else {
        bits
    };
    pick.text
}

/// The finished offset ranges (absolute, inclusive) named by a commit's
/// metadata; empty for metadata this worker did not write, or cannot read
/// (skip nothing rather than the wrong records).
pub fn decode(base: i64, metadata: &str) -> Ranges {
    let out = if let Some(body) = metadata.strip_prefix(RUNS) {
        decode_runs(base, body)
    } else if let Some(body) = metadata.strip_prefix(BITS) {
        decode_bits(base, body)
    } else if let Some(body) = metadata.strip_prefix(V1) {
        decode_v1(base, body)
    } else {
        None
    };
    out.unwrap_or_default()
}

/// Adds `(lo, hi)` to ranges built in ascending order, joining it to the
/// last one when they touch.
pub fn push(ranges: &mut Ranges, lo: i64, hi: i64) {
    match ranges.last_mut() {
        Some((_, last)) if *last + 1 >= lo => *last = (*last).max(hi),
        _ => ranges.push((lo, hi)),
    }
}

/// Every offset that `a` or `b` names.
pub fn union(a: &[(i64, i64)], b: &[(i64, i64)]) -> Ranges {
    let mut all: Vec<(i64, i64)> = a.iter().chain(b).copied().collect();
    all.sort_unstable();
    let mut out = Ranges::with_capacity(all.len());
    for (lo, hi) in all {
        push(&mut out, lo, hi);
    }
    out
}

/// One encoding, and the highest offset it names.
struct Encoded {
    text: String,
    through: i64,
}

/// The most bytes whose base64 fits in [`MAX_METADATA`] after `prefix`.
fn room(prefix: &str) -> usize {
    let chars = MAX_METADATA - prefix.len();
    chars / 4 * 3 + (chars % 4).saturating_sub(1)
}

fn finish(prefix: &str, bytes: &[u8], through: i64) -> Encoded {
    let mut text = String::from(prefix);
    URL_SAFE_NO_PAD.encode_string(bytes, &mut text);
    Encoded { text, through }
}

fn runs(base: i64, done: &[(i64, i64)]) -> Encoded {
    let room = room(RUNS);
    let (mut bytes, mut through, mut prev) = (Vec::new(), base, base);
    let mut next = Vec::with_capacity(20);
    for &(lo, hi) in done {
        next.clear();
        varint(&mut next, (lo - prev - 1) as u64);
        varint(&mut next, (hi - lo) as u64);
        if bytes.len() + next.len() > room {
            break;
        }
        bytes.extend_from_slice(&next);
        (through, prev) = (hi, hi);
    }
    finish(RUNS, &bytes, through)
}

fn bits(base: i64, done: &[(i64, i64)]) -> Encoded {
    let last = done.last().map_or(base, |(_, hi)| *hi);
    // Bit i is offset base + 1 + i.
    let span = (last - base) as u64;
    let len = (span.div_ceil(8) as usize).min(room(BITS));
    let mut bytes = vec![0u8; len];
    let through = base + (len as i64) * 8;
    for &(lo, hi) in done {
        for o in lo..=hi.min(through) {
            let i = (o - base - 1) as usize;
            bytes[i / 8] |= 1 << (i % 8);
        }
    }
    finish(BITS, &bytes, through.min(last))
}

fn varint(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push((v as u8) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

/// A varint from `bytes` at `*at`, moving `*at` past it.
fn read_varint(bytes: &[u8], at: &mut usize) -> Option<u64> {
    let mut v: u64 = 0;
    for shift in (0..64).step_by(7) {
        let b = *bytes.get(*at)?;
        *at += 1;
        v |= u64::from(b & 0x7f).checked_shl(shift)?;
        if b & 0x80 == 0 {
            return Some(v);
        }
    }
    None
}

fn decode_runs(base: i64, body: &str) -> Option<Ranges> {
    let bytes = URL_SAFE_NO_PAD.decode(body).ok()?;
    let (mut out, mut at, mut prev) = (Vec::new(), 0, base);
    while at < bytes.len() {
        let gap = i64::try_from(read_varint(&bytes, &mut at)?).ok()?;
        let len = i64::try_from(read_varint(&bytes, &mut at)?).ok()?;
        let lo = prev.checked_add(gap)?.checked_add(1)?;
        let hi = lo.checked_add(len)?;
        out.push((lo, hi));
        prev = hi;
    }
    Some(out)
}

fn decode_bits(base: i64, body: &str) -> Option<Ranges> {
    let bytes = URL_SAFE_NO_PAD.decode(body).ok()?;
    let mut out = Vec::new();
    for (i, byte) in bytes.iter().enumerate() {
        for bit in 0..8 {
            if byte & (1 << bit) != 0 {
                let o = base + 1 + (i * 8 + bit) as i64;
                push(&mut out, o, o);
            }
        }
    }
    Some(out)
}

fn decode_v1(base: i64, body: &str) -> Option<Ranges> {
    let mut out = Vec::new();
    for part in body.split(',').filter(|p| !p.is_empty()) {
        let (lo, hi) = match part.split_once('-') {
            Some((a, b)) => (a.parse::<i64>().ok()?, b.parse::<i64>().ok()?),
            None => {
                let o = part.parse::<i64>().ok()?;
                (o, o)
            }
        };
        // Offset 0 is the commit itself.
        if lo <= 0 || hi < lo {
            return None;
        }
        out.push((base + lo, base + hi));
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn a_few_long_ranges_are_run_lengths_and_many_short_ones_a_bitset() {
        let few = vec![(1_002, 1_500), (90_000, 90_010)];
        let m = encode(1_000, &few);
        assert!(m.starts_with(RUNS), "{m}");
        assert!(m.len() < 20, "{m}");
        assert_eq!(decode(1_000, &m), few);

        // Every other offset of 10,000: 5,000 ranges.
        let many: Ranges = (1..10_000).step_by(2).map(|o| (o, o)).collect();
        let m = encode(0, &many);
        assert!(m.starts_with(BITS), "{m}");
        assert!(m.len() <= MAX_METADATA, "{}", m.len());
        assert_eq!(decode(0, &m), many, "all 5,000 ranges fit in the bitset");
    }

    #[test]
    fn what_does_not_fit_is_cut_from_the_top() {
        // Every other offset of 40,000: more than either encoding holds.
        let many: Ranges = (1..40_000).step_by(2).map(|o| (o, o)).collect();
        let m = encode(0, &many);
        assert!(m.len() <= MAX_METADATA, "{}", m.len());
        let back = decode(0, &m);
        assert!(back.len() > 8_000, "{} ranges", back.len());
        assert_eq!(back[..], many[..back.len()], "a prefix of the ranges");
    }

    #[test]
    fn a_union_joins_what_touches_or_overlaps() {
        assert_eq!(
            union(&[(1, 3), (10, 12)], &[(4, 5), (11, 20), (30, 30)]),
            vec![(1, 5), (10, 20), (30, 30)]
        );
        assert_eq!(union(&[], &[(2, 2)]), vec![(2, 2)]);
    }

    #[test]
    fn earlier_releases_text_ranges_are_read() {
        assert_eq!(decode(10, "tw1:2-4,7"), vec![(12, 14), (17, 17)]);
        assert!(decode(5, "garbage").is_empty());
        assert!(decode(5, "tw1:3-x").is_empty());
        assert!(
            decode(5, "tw1:0").is_empty(),
            "offset 0 is the commit itself"
        );
        assert!(decode(5, "tw2:r!!").is_empty());
        assert!(decode(5, "tw2:x").is_empty());
    }

    /// Disjoint, non-touching ranges above `base`.
    fn ranges() -> impl Strategy<Value = (i64, Ranges)> {
        (
            0i64..1_000_000,
            prop::collection::vec((1i64..300, 0i64..50), 0..400),
        )
            .prop_map(|(base, steps)| {
                let (mut out, mut at) = (Vec::new(), base);
                for (gap, len) in steps {
                    let lo = at + gap;
                    out.push((lo, lo + len));
                    at = lo + len + 1;
                }
                (base, out)
            })
    }

    proptest! {
        /// What is decoded is what was encoded, or a prefix of it when it
        /// did not fit: never an offset that was not finished.
        #[test]
        fn decoding_gives_back_a_prefix_of_what_was_encoded((base, done) in ranges()) {
            let m = encode(base, &done);
            prop_assert!(m.len() <= MAX_METADATA);
            let back = decode(base, &m);
            let named: std::collections::BTreeSet<i64> =
                done.iter().flat_map(|&(lo, hi)| lo..=hi).collect();
            let got: Vec<i64> = back.iter().flat_map(|&(lo, hi)| lo..=hi).collect();
            for o in &got {
                prop_assert!(named.contains(o), "{} was not finished", o);
            }
            let top = got.last().copied().unwrap_or(base);
            let expected: Vec<i64> = named.iter().copied().filter(|o| *o <= top).collect();
            prop_assert_eq!(got.clone(), expected, "a prefix, without holes");
            if m.len() + 40 < MAX_METADATA {
                prop_assert_eq!(got.len(), named.len(), "short metadata names everything");
            }
        }
    }
}
