//! The generated code for cairn's gRPC contracts. The `.proto` files in `proto/cairn/v1/` are
//! the only contract between services; this crate only compiles them.

#[allow(clippy::all, clippy::unwrap_used, rust_2018_idioms)]
pub mod v1 {
    tonic::include_proto!("cairn.v1");
}

/// Encoded `FileDescriptorSet` of every cairn proto, for gRPC server reflection.
pub const FILE_DESCRIPTOR_SET: &[u8] =
    include_bytes!(concat!(env!("OUT_DIR"), "/cairn_descriptor.bin"));

pub use v1::*;

/// Refusals as a client reads them: the reason word (one word of the vocabulary in
/// common.proto) in the trailing metadata `cairn-reason`, and the same word as a
/// `google.rpc.Status` detail (`grpc-status-details-bin`) holding one `google.rpc.ErrorInfo`
/// with `reason` = the word, `domain` = [`DOMAIN`](reason::DOMAIN) and `metadata` naming what
/// was refused (`run_id`, `project`, `path`, `field`, ...). Every cairn service builds its
/// refusals here, so both forms always agree.
pub mod reason {
    use std::collections::HashMap;
    use std::time::Duration;

    use tonic::metadata::{MetadataMap, MetadataValue};
    use tonic::{Code, Status};
    pub use tonic_types::{BadRequest, ErrorInfo, PreconditionFailure, ResourceInfo, RetryInfo};
    use tonic_types::{ErrorDetails, StatusExt};

    /// Metadata key carrying the reason word.
    pub const METADATA_KEY: &str = "cairn-reason";
    /// The `ErrorInfo.domain` of every cairn refusal.
    pub const DOMAIN: &str = "cairn";
    /// A request that is not a valid protobuf message of the RPC's request type.
    pub const MALFORMED: &str = "malformed";
    /// A request enum field holds a number the server does not know.
    pub const UNKNOWN_ENUM: &str = "unknown_enum";

    /// A status with `message`, the reason word in its metadata and an `ErrorInfo` detail.
    pub fn status(code: Code, message: impl Into<String>, reason: &str) -> Status {
        status_with(code, message, reason, &[])
    }

    /// [`status`] whose `ErrorInfo.metadata` also holds `metadata` (pairs with an empty value
    /// are left out), e.g. `&[("run_id", id)]` on an ALREADY_EXISTS. The other details follow
    /// from the code (see [`Extra`]).
    pub fn status_with(
        code: Code,
        message: impl Into<String>,
        reason: &str,
        metadata: &[(&str, &str)],
    ) -> Status {
        detailed(code, message, reason, metadata, Extra::default())
    }

    /// Details beyond `ErrorInfo` a refusal names itself; what it leaves out is derived from
    /// the code and the `ErrorInfo.metadata`:
    /// - INVALID_ARGUMENT / OUT_OF_RANGE: `BadRequest`, one violation for the `field` metadata
    ///   (empty when the request as a whole is refused), described by the message;
    /// - UNAVAILABLE / RESOURCE_EXHAUSTED: `RetryInfo` (1 s, or `retry_after_s`), except for
    ///   the [`NOT_RETRYABLE`] reasons (a request too large stays too large);
    /// - FAILED_PRECONDITION / ABORTED: `PreconditionFailure`, type = the reason word, subject =
    ///   the `path`, `run_id` or `project` metadata;
    /// - NOT_FOUND: `ResourceInfo` for the `session_id`, `node_id`, `run_id`, `path` or
    ///   `project` metadata (types `session`, `node`, `run`, `file`, `project`), owner = the
    ///   project.
    #[derive(Clone, Debug, Default)]
    pub struct Extra {
        /// `BadRequest` field violations: (field path, what is wrong with it).
        pub violations: Vec<(String, String)>,
        /// `RetryInfo.retry_delay`.
        pub retry_after: Option<Duration>,
    }

    /// RESOURCE_EXHAUSTED reasons a retry cannot cure: they carry no `RetryInfo` (a full
    /// snapshot quota stays full until someone removes snapshots).
    pub const NOT_RETRYABLE: &[&str] = &[
        "too_large",
        "too_many_files",
        "too_many_sessions",
        "snapshot_quota",
    ];

    /// The delay `RetryInfo` carries when the refusal names none.
    pub const DEFAULT_RETRY: Duration = Duration::from_secs(1);

    /// Resource types of `ResourceInfo`, by the `ErrorInfo.metadata` key naming the resource,
    /// most specific first.
    pub const RESOURCE_KEYS: &[(&str, &str)] = &[
        ("session_id", "session"),
        ("node_id", "node"),
        ("run_id", "run"),
        ("path", "file"),
        ("project", "project"),
    ];

    /// [`status_with`] with details of its own (field paths, a retry delay).
    pub fn detailed(
        code: Code,
        message: impl Into<String>,
        reason: &str,
        metadata: &[(&str, &str)],
        extra: Extra,
    ) -> Status {
        let message = message.into();
        let info: HashMap<String, String> = metadata
            .iter()
            .filter(|(_, v)| !v.is_empty())
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect();
        let mut details = ErrorDetails::new();
        derive(&mut details, code, reason, &message, &info, extra);
        details.set_error_info(reason, DOMAIN, info);
        let mut headers = MetadataMap::new();
        if let Ok(value) = MetadataValue::try_from(reason) {
            headers.insert(METADATA_KEY, value);
        }
        Status::with_error_details_and_metadata(code, message, details, headers)
    }

    fn derive(
        details: &mut ErrorDetails,
        code: Code,
        reason: &str,
        message: &str,
        info: &HashMap<String, String>,
        extra: Extra,
    ) {
        let get = |k: &str| info.get(k).cloned().unwrap_or_default();
        match code {
            Code::InvalidArgument | Code::OutOfRange => {
                let violations = if extra.violations.is_empty() {
                    vec![(get("field"), message.to_owned())]
                } else {
                    extra.violations
                };
                for (field, why) in violations {
                    details.add_bad_request_violation(field, why);
                }
            }
            Code::Unavailable | Code::ResourceExhausted if !NOT_RETRYABLE.contains(&reason) => {
                let delay = extra.retry_after.or_else(|| {
                    info.get("retry_after_s")
                        .and_then(|s| s.parse().ok())
                        .map(Duration::from_secs)
                });
                details.set_retry_info(Some(delay.unwrap_or(DEFAULT_RETRY)));
            }
            Code::FailedPrecondition | Code::Aborted => {
                let subject = ["path", "run_id", "session_id", "project"]
                    .iter()
                    .map(|k| get(k))
                    .find(|v| !v.is_empty())
                    .unwrap_or_default();
                details.add_precondition_failure_violation(reason, subject, message);
            }
            Code::NotFound => {
                let (kind, name) = RESOURCE_KEYS
                    .iter()
                    .find_map(|(k, kind)| info.get(*k).map(|v| (*kind, v.clone())))
                    .unwrap_or((reason, String::new()));
                let owner = if kind == "project" {
                    String::new()
                } else {
                    get("project")
                };
                details.set_resource_info(kind, name, owner, message);
            }
            _ => {}
        }
    }

    /// A status `from` is relayed as: another code and message, the same reason word and
    /// `ErrorInfo` metadata (a service passing on its dependency's refusal).
    pub fn relay(code: Code, message: impl Into<String>, from: &Status) -> Status {
        let metadata = info(from).map(|i| i.metadata).unwrap_or_default();
        let pairs: Vec<(&str, &str)> = metadata
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_str()))
            .collect();
        let reason = of(from).unwrap_or_else(|| fallback(code).to_owned());
        let extra = Extra {
            violations: violations(from),
            retry_after: retry_delay(from),
        };
        detailed(code, message, &reason, &pairs, extra)
    }

    /// The `RetryInfo` delay of a status, if it carries one.
    pub fn retry_delay(status: &Status) -> Option<Duration> {
        status.get_details_retry_info().and_then(|r| r.retry_delay)
    }

    /// The `ResourceInfo` of a status: (type, name, owner).
    pub fn resource(status: &Status) -> Option<(String, String, String)> {
        status
            .get_details_resource_info()
            .map(|r| (r.resource_type, r.resource_name, r.owner))
    }

    /// The `PreconditionFailure` violations of a status: (type, subject).
    pub fn preconditions(status: &Status) -> Vec<(String, String)> {
        status
            .get_details_precondition_failure()
            .map(|p| {
                p.violations
                    .into_iter()
                    .map(|v| (v.r#type, v.subject))
                    .collect()
            })
            .unwrap_or_default()
    }

    /// The `BadRequest` field violations of a status: (field path, description).
    pub fn violations(status: &Status) -> Vec<(String, String)> {
        status
            .get_details_bad_request()
            .map(|b| {
                b.field_violations
                    .into_iter()
                    .map(|v| (v.field, v.description))
                    .collect()
            })
            .unwrap_or_default()
    }

    /// The reason word of a code when nothing more precise names the refusal.
    pub fn fallback(code: Code) -> &'static str {
        match code {
            Code::InvalidArgument | Code::OutOfRange => "invalid_argument",
            Code::NotFound => "not_found",
            Code::AlreadyExists => "exists",
            Code::PermissionDenied => "denied",
            Code::Unauthenticated => "unauthenticated",
            Code::ResourceExhausted => "too_large",
            Code::FailedPrecondition => "wrong_state",
            Code::Aborted => "conflict",
            Code::Unavailable => "unavailable",
            Code::DeadlineExceeded => "deadline_exceeded",
            Code::Cancelled => "cancelled",
            _ => "internal",
        }
    }

    /// The reason word of a status: its `cairn-reason` metadata, else its `ErrorInfo`.
    pub fn of(status: &Status) -> Option<String> {
        status
            .metadata()
            .get(METADATA_KEY)
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned)
            .or_else(|| info(status).map(|i| i.reason))
    }

    /// The `ErrorInfo` detail of a status, if it carries one.
    pub fn info(status: &Status) -> Option<ErrorInfo> {
        status.get_details_error_info()
    }

    /// One `ErrorInfo.metadata` value of a status (`run_id`, `path`, ...).
    pub fn detail(status: &Status, key: &str) -> Option<String> {
        info(status).and_then(|mut i| i.metadata.remove(key))
    }

    /// The known value of a request enum field, or INVALID_ARGUMENT with reason
    /// [`UNKNOWN_ENUM`] naming the field (`ErrorInfo.metadata.field`): a number this server
    /// does not know is refused, never read as the default.
    pub fn known<E: TryFrom<i32>>(field: &str, value: i32) -> Result<E, Status> {
        E::try_from(value).map_err(|_| {
            let ty = std::any::type_name::<E>().rsplit("::").next().unwrap_or("enum");
            status_with(
                Code::InvalidArgument,
                format!("{field} = {value} is not a known cairn.v1.{ty} value: send one of the values the proto declares (this server may be older than the client)"),
                UNKNOWN_ENUM,
                &[("field", field), ("value", &value.to_string())],
            )
        })
    }
}

#[cfg(test)]
mod tests {
    use super::reason;
    use tonic::Code;

    #[test]
    fn a_refusal_carries_the_word_twice_and_its_metadata() {
        let s = reason::status_with(
            Code::AlreadyExists,
            "m",
            "exists",
            &[("run_id", "r1"), ("path", "")],
        );
        assert_eq!(reason::of(&s).as_deref(), Some("exists"));
        let info = reason::info(&s).expect("ErrorInfo");
        assert_eq!(
            (info.reason.as_str(), info.domain.as_str()),
            ("exists", "cairn")
        );
        assert_eq!(reason::detail(&s, "run_id").as_deref(), Some("r1"));
        assert!(!info.metadata.contains_key("path"));
        let relayed = reason::relay(Code::Unavailable, "again", &s);
        assert_eq!(reason::of(&relayed).as_deref(), Some("exists"));
        assert_eq!(reason::detail(&relayed, "run_id").as_deref(), Some("r1"));
    }

    #[test]
    fn unknown_enum_numbers_are_refused() {
        let e = reason::known::<super::PutDurability>("durability", 9).expect_err("9 is unknown");
        assert_eq!(e.code(), Code::InvalidArgument);
        assert_eq!(reason::of(&e).as_deref(), Some(reason::UNKNOWN_ENUM));
        assert_eq!(reason::detail(&e, "field").as_deref(), Some("durability"));
        assert!(reason::known::<super::PutDurability>("durability", 1).is_ok());
    }

    #[test]
    fn details_follow_the_code() {
        use tonic_types::StatusExt;
        let bad = reason::status_with(
            Code::InvalidArgument,
            "no",
            "invalid_id",
            &[("field", "run_id")],
        );
        assert_eq!(
            reason::violations(&bad),
            vec![("run_id".to_owned(), "no".to_owned())]
        );
        let busy = reason::status(Code::ResourceExhausted, "busy", "max_concurrent_runs");
        assert!(busy.get_details_retry_info().is_some());
        let big = reason::status(Code::ResourceExhausted, "big", "too_large");
        assert!(big.get_details_retry_info().is_none());
        let gone = reason::status_with(
            Code::NotFound,
            "gone",
            "not_found",
            &[("project", "p"), ("run_id", "r")],
        );
        let r = gone.get_details_resource_info().expect("ResourceInfo");
        assert_eq!(
            (
                r.resource_type.as_str(),
                r.resource_name.as_str(),
                r.owner.as_str()
            ),
            ("run", "r", "p")
        );
        let changed = reason::status_with(
            Code::FailedPrecondition,
            "m",
            "changed",
            &[("path", "a.md")],
        );
        let p = changed
            .get_details_precondition_failure()
            .expect("PreconditionFailure");
        assert_eq!(
            (
                p.violations[0].r#type.as_str(),
                p.violations[0].subject.as_str()
            ),
            ("changed", "a.md")
        );
        let relayed = reason::relay(Code::InvalidArgument, "again", &bad);
        assert_eq!(reason::violations(&relayed)[0].0, "run_id");
    }
}
