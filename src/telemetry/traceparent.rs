//! W3C Trace Context (<https://www.w3.org/TR/trace-context/>): the
//! `traceparent` header parsed and written by hand, and the raw trace
//! headers of a Kafka record.
//!
//! Pure: no I/O, no client crate. A header that does not parse is never an
//! error for the job: the caller starts a new trace instead.

/// The `traceparent` header's name (HTTP and Kafka alike).
pub const TRACEPARENT: &str = "traceparent";
/// The `tracestate` header's name.
pub const TRACESTATE: &str = "tracestate";

/// The longest `tracestate` carried on: the spec asks that at least 512
/// characters be propagated; a longer one is dropped rather than cut (a
/// cut could split an entry), the traceparent still goes on.
pub const MAX_TRACESTATE: usize = 512;

/// The trace headers of a consumed record, as they were (bytes, unchecked),
/// so that a retry-topic or dead-letter copy carries them unchanged.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TraceHeaders {
    /// The first `traceparent` header, if any.
    pub traceparent: Option<Vec<u8>>,
    /// The first `tracestate` header, if any.
    pub tracestate: Option<Vec<u8>>,
}

impl TraceHeaders {
    /// Picks the trace headers out of a record's `(name, value)` pairs. A
    /// repeated header keeps its first value (the spec: a request with
    /// several traceparent headers is invalid; the first is as good a
    /// guess as any, and it is only the parent of a new span).
    pub fn from_pairs<'a>(pairs: impl IntoIterator<Item = (&'a str, Option<&'a [u8]>)>) -> Self {
        let mut out = TraceHeaders::default();
        for (name, value) in pairs {
            let Some(value) = value else { continue };
            if name.eq_ignore_ascii_case(TRACEPARENT) && out.traceparent.is_none() {
                out.traceparent = Some(value.to_vec());
            } else if name.eq_ignore_ascii_case(TRACESTATE) && out.tracestate.is_none() {
                out.tracestate = Some(value.to_vec());
            }
        }
        out
    }

    /// The headers to copy onto a retry-topic or dead-letter record.
    pub fn pairs(&self) -> impl Iterator<Item = (&'static str, &[u8])> {
        [
            (TRACEPARENT, self.traceparent.as_deref()),
            (TRACESTATE, self.tracestate.as_deref()),
        ]
        .into_iter()
        .filter_map(|(k, v)| v.map(|v| (k, v)))
    }

    /// The remote parent these headers name: `Ok(None)` when there is no
    /// traceparent, `Err` when there is one that is not valid. The
    /// tracestate is kept only with a valid traceparent (the spec), when it
    /// is printable ASCII and at most [`MAX_TRACESTATE`] bytes.
    pub fn parent(&self) -> Result<Option<(TraceParent, Option<String>)>, Invalid> {
        let Some(raw) = &self.traceparent else {
            return Ok(None);
        };
        let parent = TraceParent::parse(raw)?;
        let state = self
            .tracestate
            .as_deref()
            .filter(|s| s.len() <= MAX_TRACESTATE && s.iter().all(|b| (0x20..0x7f).contains(b)))
            .and_then(|s| std::str::from_utf8(s).ok())
            .map(|s| s.trim().to_owned())
            .filter(|s| !s.is_empty());
        Ok(Some((parent, state)))
    }
}

/// A parsed `traceparent`: version 00's fields (a later version is read
/// as 00, as the spec says).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TraceParent {
    /// Never all zero.
    pub trace_id: [u8; 16],
    /// The caller's span. Never all zero.
    pub parent_id: [u8; 8],
    /// Bit 0: sampled. Other bits are kept as received but not written.
    pub flags: u8,
}

/// Why a `traceparent` is not valid. The label is fixed (a metric label,
/// a log field): the header's text is never echoed, it is input from
/// whoever produced the record.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum Invalid {
    #[error("traceparent does not have the version-trace_id-parent_id-flags shape")]
    Shape,
    #[error("traceparent has a character that is not lowercase hex")]
    NotHex,
    #[error("traceparent has version ff, which is forbidden")]
    Version,
    #[error("traceparent has an all-zero trace id")]
    ZeroTraceId,
    #[error("traceparent has an all-zero parent id")]
    ZeroParentId,
}

impl Invalid {
    /// A short, fixed label for metrics.
    pub fn kind(&self) -> &'static str {
        match self {
            Invalid::Shape => "shape",
            Invalid::NotHex => "not_hex",
            Invalid::Version => "version",
            Invalid::ZeroTraceId => "zero_trace_id",
            Invalid::ZeroParentId => "zero_parent_id",
        }
    }
}

/// The length of a version-00 traceparent: `2+1+32+1+16+1+2`.
const LEN_00: usize = 55;

impl TraceParent {
    /// Parses a header value. Surrounding spaces and tabs are allowed (HTTP
    /// optional whitespace); hex must be lowercase. Version 00 is exactly
    /// 55 characters; a higher version may go on after a `-` (its extra
    /// fields are ignored).
    ///
    /// ```
    /// use throttle_worker::telemetry::traceparent::TraceParent;
    ///
    /// let h = b"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
    /// let tp = TraceParent::parse(h).unwrap();
    /// assert!(tp.sampled());
    /// assert_eq!(tp.to_header(), std::str::from_utf8(h).unwrap());
    /// assert!(TraceParent::parse(b"00-00000000000000000000000000000000-00f067aa0ba902b7-01").is_err());
    /// ```
    pub fn parse(raw: &[u8]) -> Result<TraceParent, Invalid> {
        let raw = trim(raw);
        if raw.len() < LEN_00 {
            return Err(Invalid::Shape);
        }
        if raw[2] != b'-' || raw[35] != b'-' || raw[52] != b'-' {
            return Err(Invalid::Shape);
        }
        let version = hex::<1>(&raw[0..2])?[0];
        if version == 0xff {
            return Err(Invalid::Version);
        }
        match (version, raw.len()) {
            (0, LEN_00) => {}
            (0, _) => return Err(Invalid::Shape),
            // A future version: more fields may follow, after a dash.
            (_, LEN_00) => {}
            (_, _) if raw[LEN_00] == b'-' => {}
            _ => return Err(Invalid::Shape),
        }
        let trace_id = hex::<16>(&raw[3..35])?;
        let parent_id = hex::<8>(&raw[36..52])?;
        let flags = hex::<1>(&raw[53..55])?[0];
        if trace_id == [0; 16] {
            return Err(Invalid::ZeroTraceId);
        }
        if parent_id == [0; 8] {
            return Err(Invalid::ZeroParentId);
        }
        Ok(TraceParent {
            trace_id,
            parent_id,
            flags,
        })
    }

    pub fn sampled(&self) -> bool {
        self.flags & 1 == 1
    }

    /// The header value, version 00. Only the sampled flag is written:
    /// version 00 defines no other, and the spec asks that unknown ones be
    /// zeroed.
    pub fn to_header(&self) -> String {
        format!(
            "00-{}-{}-{:02x}",
            to_hex(&self.trace_id),
            to_hex(&self.parent_id),
            self.flags & 1
        )
    }
}

fn trim(raw: &[u8]) -> &[u8] {
    let ws = |b: &u8| *b == b' ' || *b == b'\t';
    let start = raw.iter().position(|b| !ws(b)).unwrap_or(raw.len());
    let end = raw.iter().rposition(|b| !ws(b)).map_or(start, |i| i + 1);
    &raw[start..end]
}

/// `2 * N` lowercase hex digits as bytes.
fn hex<const N: usize>(s: &[u8]) -> Result<[u8; N], Invalid> {
    let digit = |c: u8| match c {
        b'0'..=b'9' => Ok(c - b'0'),
        b'a'..=b'f' => Ok(c - b'a' + 10),
        _ => Err(Invalid::NotHex),
    };
    let mut out = [0u8; N];
    for (i, pair) in s.chunks_exact(2).enumerate() {
        out[i] = digit(pair[0])? << 4 | digit(pair[1])?;
    }
    Ok(out)
}

/// Lowercase hex of `bytes`.
pub fn to_hex(bytes: &[u8]) -> String {
    use std::fmt::Write;
    bytes
        .iter()
        .fold(String::with_capacity(bytes.len() * 2), |mut s, b| {
            let _ = write!(s, "{b:02x}");
            s
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    const GOOD: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

    #[test]
    fn the_spec_example_round_trips() {
        let tp = TraceParent::parse(GOOD.as_bytes()).unwrap();
        assert_eq!(to_hex(&tp.trace_id), "4bf92f3577b34da6a3ce929d0e0e4736");
        assert_eq!(to_hex(&tp.parent_id), "00f067aa0ba902b7");
        assert!(tp.sampled());
        assert_eq!(tp.to_header(), GOOD);
    }

    #[test]
    fn header_table() {
        // (row, header, expected: Ok(flags) or the error)
        let later = format!("cc{}-what-the-future-holds", &GOOD[2..]);
        let rows: Vec<(u32, String, Result<u8, Invalid>)> = vec![
            (1, GOOD.to_owned(), Ok(1)),
            (2, GOOD.replace("-01", "-00"), Ok(0)),
            (3, format!("  {GOOD}\t"), Ok(1)),
            // Unknown flag bits are read, then zeroed on the way out.
            (4, GOOD.replace("-01", "-ff"), Ok(0xff)),
            (5, format!("cc{}", &GOOD[2..]), Ok(1)),
            (6, later, Ok(1)),
            (7, format!("ff{}", &GOOD[2..]), Err(Invalid::Version)),
            (8, GOOD.to_uppercase(), Err(Invalid::NotHex)),
            (9, GOOD.replace("4bf9", "4bg9"), Err(Invalid::NotHex)),
            (10, format!("{GOOD}-00"), Err(Invalid::Shape)),
            (11, GOOD[..54].to_owned(), Err(Invalid::Shape)),
            (12, GOOD.replacen('-', "_", 1), Err(Invalid::Shape)),
            (13, String::new(), Err(Invalid::Shape)),
            (
                14,
                "00-00000000000000000000000000000000-00f067aa0ba902b7-01".to_owned(),
                Err(Invalid::ZeroTraceId),
            ),
            (
                15,
                "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01".to_owned(),
                Err(Invalid::ZeroParentId),
            ),
            (16, format!("cc{}x", &GOOD[2..]), Err(Invalid::Shape)),
            (
                17,
                "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-0".to_owned(),
                Err(Invalid::Shape),
            ),
        ];
        for (row, header, expected) in rows {
            let got = TraceParent::parse(header.as_bytes()).map(|tp| tp.flags);
            assert_eq!(got, expected, "row {row}: {header:?}");
        }
        let tp = TraceParent::parse(GOOD.replace("-01", "-ff").as_bytes()).unwrap();
        assert!(
            tp.to_header().ends_with("-01"),
            "only the sampled bit is written"
        );
    }

    #[test]
    fn tracestate_goes_with_a_valid_traceparent_only() {
        let mut h = TraceHeaders::from_pairs([
            ("traceparent", Some(GOOD.as_bytes())),
            ("tracestate", Some(&b"congo=t61rcWkgMzE"[..])),
            ("traceparent", Some(&b"junk"[..])),
        ]);
        let (tp, state) = h.parent().unwrap().unwrap();
        assert_eq!(tp.to_header(), GOOD, "the first traceparent wins");
        assert_eq!(state.as_deref(), Some("congo=t61rcWkgMzE"));
        h.tracestate = Some(vec![b'a'; MAX_TRACESTATE + 1]);
        assert_eq!(h.parent().unwrap().unwrap().1, None, "too long: dropped");
        h.tracestate = Some(b"a=\x01".to_vec());
        assert_eq!(
            h.parent().unwrap().unwrap().1,
            None,
            "control byte: dropped"
        );
        h.traceparent = Some(b"junk".to_vec());
        assert_eq!(h.parent(), Err(Invalid::Shape));
        assert_eq!(TraceHeaders::default().parent(), Ok(None));
        let pairs: Vec<_> = h.pairs().map(|(k, _)| k).collect();
        assert_eq!(pairs, ["traceparent", "tracestate"], "copied as they were");
    }
}
