//! The job envelope: what one Kafka record value carries, and how it is
//! checked before anything else touches it.
//!
//! A record value is JSON `{"job_id": "...", "seller_id": "...", "payload": <any JSON>}`.
//! The payload is kept as raw JSON text and forwarded byte for byte as the
//! downstream body, so parsing never re-serialises it. Unknown top-level
//! fields are ignored so producers can add metadata without breaking workers.

use std::fmt;

use serde::{Deserialize, Deserializer};
use serde_json::value::RawValue;

/// The seller a job is throttled under. Never empty and free of control
/// characters (it travels as the `X-Seller-Id` header and inside Redis keys).
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SellerId(String);

impl SellerId {
    /// Builds a seller id, or says why the text cannot be one.
    pub fn new(id: impl Into<String>) -> Result<SellerId, JobError> {
        let id = id.into();
        check_id(Field::SellerId, &id)?;
        Ok(SellerId(id))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for SellerId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// One parsed job.
#[derive(Debug)]
pub struct Job {
    /// Non-empty, no control characters: sent as `Idempotency-Key`.
    pub job_id: String,
    pub seller_id: SellerId,
    /// The `payload` member exactly as it appeared in the record (any JSON,
    /// `null` included), at most the configured `max_payload_bytes` long.
    pub payload: Box<RawValue>,
}

/// Which id field an error is about.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Field {
    JobId,
    SellerId,
}

impl fmt::Display for Field {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Field::JobId => "job_id",
            Field::SellerId => "seller_id",
        })
    }
}

/// Why a record value is not a job. The `Display` text is written to the
/// dead-letter record's `x-error` header, so it says what is wrong without
/// echoing the payload.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum JobError {
    #[error("record value is empty or null (tombstone); expected a JSON job object")]
    Empty,
    #[error("record value is not valid UTF-8 (invalid byte at offset {valid_up_to})")]
    NotUtf8 { valid_up_to: usize },
    /// `reason` is serde_json's message: a position and an expectation,
    /// never the document's text.
    #[error("record value is not valid JSON: {reason}")]
    NotJson { reason: String },
    #[error("record value is JSON {found}, expected an object with job_id, seller_id and payload")]
    NotAnObject { found: &'static str },
    #[error("job has an invalid field: {reason}")]
    BadField { reason: String },
    #[error("job has no {0} (or it is null)")]
    MissingId(Field),
    #[error("job has an empty {0}")]
    EmptyId(Field),
    #[error("job {0} contains a control character, which cannot be sent as an HTTP header")]
    ControlCharacter(Field),
    #[error("job has no payload member")]
    MissingPayload,
    #[error("job payload is {size} bytes, over the limit of {limit} bytes")]
    PayloadTooLarge { size: usize, limit: usize },
}

impl JobError {
    /// A short, fixed label for metrics (bounded cardinality).
    pub fn kind(&self) -> &'static str {
        match self {
            JobError::Empty => "empty",
            JobError::NotUtf8 { .. } => "not_utf8",
            JobError::NotJson { .. } => "not_json",
            JobError::NotAnObject { .. } => "not_object",
            JobError::BadField { .. } => "bad_field",
            JobError::MissingId(_) => "missing_id",
            JobError::EmptyId(_) => "empty_id",
            JobError::ControlCharacter(_) => "control_character",
            JobError::MissingPayload => "missing_payload",
            JobError::PayloadTooLarge { .. } => "payload_too_large",
        }
    }
}

/// The wire shape. Every member is optional here so that a missing one gets
/// its own error instead of serde's generic "missing field".
#[derive(Deserialize)]
struct Envelope {
    #[serde(default)]
    job_id: Option<String>,
    #[serde(default)]
    seller_id: Option<String>,
    /// `None` only when the member is absent; a JSON `null` is kept as raw
    /// `null` (a plain `Option` would fold it into `None`).
    #[serde(default, deserialize_with = "present")]
    payload: Option<Box<RawValue>>,
}

fn present<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Box<RawValue>>, D::Error> {
    Box::<RawValue>::deserialize(d).map(Some)
}

impl Job {
    /// Parses one record value. Pass `&[]` for a record without a value.
    ///
    /// ```
    /// use throttle_worker::job::{Job, JobError};
    ///
    /// let job = Job::parse(br#"{"job_id":"j1","seller_id":"s1","payload":{"a": 1}}"#, 1024).unwrap();
    /// assert_eq!(job.payload.get(), r#"{"a": 1}"#);
    /// assert_eq!(Job::parse(b"", 1024).unwrap_err(), JobError::Empty);
    /// ```
    pub fn parse(value: &[u8], max_payload_bytes: usize) -> Result<Job, JobError> {
        let text = std::str::from_utf8(value).map_err(|e| JobError::NotUtf8 {
            valid_up_to: e.valid_up_to(),
        })?;
        let trimmed = text.trim_start();
        match trimmed.as_bytes().first() {
            None => return Err(JobError::Empty),
            Some(b'{') => {}
            // Checked before serde so its "invalid type: string \"...\""
            // message cannot quote a whole non-object value into x-error.
            Some(&b) => return Err(not_an_object(b, trimmed)),
        }
        let envelope: Envelope = serde_json::from_str(text).map_err(classify)?;
        let job_id = required_id(Field::JobId, envelope.job_id)?;
        let seller_id = SellerId(required_id(Field::SellerId, envelope.seller_id)?);
        let payload = envelope.payload.ok_or(JobError::MissingPayload)?;
        let size = payload.get().len();
        if size > max_payload_bytes {
            return Err(JobError::PayloadTooLarge {
                size,
                limit: max_payload_bytes,
            });
        }
        Ok(Job {
            job_id,
            seller_id,
            payload,
        })
    }

    /// The downstream body: the payload's bytes as they were in the record.
    pub fn payload_bytes(&self) -> &[u8] {
        self.payload.get().as_bytes()
    }
}

fn required_id(field: Field, value: Option<String>) -> Result<String, JobError> {
    let value = value.ok_or(JobError::MissingId(field))?;
    check_id(field, &value)?;
    Ok(value)
}

fn check_id(field: Field, value: &str) -> Result<(), JobError> {
    if value.is_empty() {
        return Err(JobError::EmptyId(field));
    }
    if value.chars().any(char::is_control) {
        return Err(JobError::ControlCharacter(field));
    }
    Ok(())
}

/// Names the JSON kind from its first byte, or reports broken JSON.
fn not_an_object(first: u8, text: &str) -> JobError {
    let found = match first {
        b'[' => "array",
        b'"' => "string",
        b't' | b'f' => "boolean",
        b'n' if text.trim_end() == "null" => return JobError::Empty,
        b'n' => "null",
        b'-' | b'0'..=b'9' => "number",
        _ => {
            // Not a JSON value at all: let serde name the position.
            return match serde_json::from_str::<serde::de::IgnoredAny>(text) {
                Err(e) => classify(e),
                Ok(_) => JobError::NotAnObject { found: "value" },
            };
        }
    };
    JobError::NotAnObject { found }
}

/// Syntax and end-of-input errors mean "not JSON"; data errors mean a member
/// has the wrong type (e.g. a numeric job_id).
fn classify(e: serde_json::Error) -> JobError {
    use serde_json::error::Category;
    match e.classify() {
        Category::Data => JobError::BadField {
            reason: e.to_string(),
        },
        Category::Syntax | Category::Eof | Category::Io => JobError::NotJson {
            reason: e.to_string(),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const LIMIT: usize = 64;

    /// (row, record value, expected (job_id, seller_id, payload) or error)
    type Row<'a> = (u32, &'a [u8], Result<(&'a str, &'a str, &'a str), JobError>);

    #[test]
    fn parse_table() {
        use JobError::*;
        let big = format!(
            r#"{{"job_id":"j","seller_id":"s","payload":"{}"}}"#,
            "x".repeat(LIMIT)
        );
        let cases: Vec<Row> = vec![
            (
                1,
                br#"{"job_id":"j1","seller_id":"s1","payload":{"a":1}}"#,
                Ok(("j1", "s1", r#"{"a":1}"#)),
            ),
            // payload kept byte for byte: spacing, key order, number spelling.
            (
                2,
                br#"{"payload": { "z" : 1.50, "a":[ ] } ,"seller_id":"s","job_id":"j"}"#,
                Ok(("j", "s", r#"{ "z" : 1.50, "a":[ ] }"#)),
            ),
            (
                3,
                br#"{"job_id":"j","seller_id":"s","payload":null}"#,
                Ok(("j", "s", "null")),
            ),
            (
                4,
                br#"{"job_id":"j","seller_id":"s","payload":"text","extra":true}"#,
                Ok(("j", "s", r#""text""#)),
            ),
            (5, b"", Err(Empty)),
            (6, b"  \n ", Err(Empty)),
            (7, b"null", Err(Empty)),
            (8, b"\xff\xfe{}", Err(NotUtf8 { valid_up_to: 0 })),
            (
                9,
                b"{\"job_id\":",
                Err(NotJson {
                    reason: "EOF while parsing a value at line 1 column 10".into(),
                }),
            ),
            (
                10,
                b"hello",
                Err(NotJson {
                    reason: "expected value at line 1 column 1".into(),
                }),
            ),
            (11, b"[1,2]", Err(NotAnObject { found: "array" })),
            (
                12,
                br#""secret payload""#,
                Err(NotAnObject { found: "string" }),
            ),
            (13, b"42", Err(NotAnObject { found: "number" })),
            (
                14,
                br#"{"seller_id":"s","payload":1}"#,
                Err(MissingId(Field::JobId)),
            ),
            (
                15,
                br#"{"job_id":null,"seller_id":"s","payload":1}"#,
                Err(MissingId(Field::JobId)),
            ),
            (
                16,
                br#"{"job_id":"","seller_id":"s","payload":1}"#,
                Err(EmptyId(Field::JobId)),
            ),
            (
                17,
                br#"{"job_id":"j","payload":1}"#,
                Err(MissingId(Field::SellerId)),
            ),
            (
                18,
                br#"{"job_id":"j","seller_id":"","payload":1}"#,
                Err(EmptyId(Field::SellerId)),
            ),
            (
                19,
                br#"{"job_id":"j","seller_id":"s"}"#,
                Err(MissingPayload),
            ),
            (
                20,
                big.as_bytes(),
                Err(PayloadTooLarge {
                    size: LIMIT + 2,
                    limit: LIMIT,
                }),
            ),
            (
                21,
                br#"{"job_id":5,"seller_id":"s","payload":1}"#,
                Err(BadField {
                    reason: "invalid type: integer `5`, expected a string at line 1 column 11"
                        .into(),
                }),
            ),
            (
                22,
                b"{\"job_id\":\"a\\nb\",\"seller_id\":\"s\",\"payload\":1}",
                Err(ControlCharacter(Field::JobId)),
            ),
            (
                23,
                br#"{"job_id":"j","seller_id":"s","payload":1} trailing"#,
                Err(NotJson {
                    reason: "trailing characters at line 1 column 44".into(),
                }),
            ),
        ];
        for (row, value, want) in cases {
            let got = Job::parse(value, LIMIT);
            match (got, want) {
                (Ok(job), Ok((id, seller, payload))) => {
                    assert_eq!(job.job_id, id, "row {row}");
                    assert_eq!(job.seller_id.as_str(), seller, "row {row}");
                    assert_eq!(job.payload.get(), payload, "row {row}");
                }
                (Err(got), Err(want)) => assert_eq!(got, want, "row {row}: {got}"),
                (got, want) => panic!("row {row}: got {got:?}, want {want:?}"),
            }
        }
    }

    #[test]
    fn payload_exactly_at_limit_is_accepted() {
        let payload = format!("\"{}\"", "x".repeat(LIMIT - 2));
        let value = format!(r#"{{"job_id":"j","seller_id":"s","payload":{payload}}}"#);
        let job = Job::parse(value.as_bytes(), LIMIT).expect("payload of exactly LIMIT bytes");
        assert_eq!(job.payload_bytes(), payload.as_bytes());
    }

    #[test]
    fn error_messages_are_readable_and_never_quote_the_payload() {
        let e = Job::parse(br#""do not leak me""#, LIMIT).unwrap_err();
        assert!(!e.to_string().contains("leak"), "{e}");
        let e = Job::parse(
            br#"{"job_id":"j","seller_id":"s","payload":"0123456789"}"#,
            4,
        )
        .unwrap_err();
        assert_eq!(
            e.to_string(),
            "job payload is 12 bytes, over the limit of 4 bytes"
        );
        assert_eq!(e.kind(), "payload_too_large");
        let e = Job::parse(b"{", LIMIT).unwrap_err();
        assert_eq!(
            e.to_string(),
            "record value is not valid JSON: EOF while parsing an object at line 1 column 1"
        );
        assert_eq!(
            JobError::EmptyId(Field::SellerId).to_string(),
            "job has an empty seller_id"
        );
    }

    #[test]
    fn seller_id_constructor_validates() {
        assert_eq!(
            SellerId::new("s-1").map(|s| s.to_string()),
            Ok("s-1".to_owned())
        );
        assert_eq!(SellerId::new(""), Err(JobError::EmptyId(Field::SellerId)));
        assert_eq!(
            SellerId::new("a\tb"),
            Err(JobError::ControlCharacter(Field::SellerId))
        );
    }
}
