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

    use tonic::metadata::{MetadataMap, MetadataValue};
    use tonic::{Code, Status};
    pub use tonic_types::ErrorInfo;
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
    /// are left out), e.g. `&[("run_id", id)]` on an ALREADY_EXISTS.
    pub fn status_with(
        code: Code,
        message: impl Into<String>,
        reason: &str,
        metadata: &[(&str, &str)],
    ) -> Status {
        let info: HashMap<String, String> = metadata
            .iter()
            .filter(|(_, v)| !v.is_empty())
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect();
        let mut headers = MetadataMap::new();
        if let Ok(value) = MetadataValue::try_from(reason) {
            headers.insert(METADATA_KEY, value);
        }
        Status::with_error_details_and_metadata(
            code,
            message,
            ErrorDetails::with_error_info(reason, DOMAIN, info),
            headers,
        )
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
        status_with(code, message, &reason, &pairs)
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
}
