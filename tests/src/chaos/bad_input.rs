//! Bad input of every kind: malformed stream entries and bad API requests.

use super::TOKEN;

/// One kind of bad input.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum BadInput {
    /// A stream entry with none of the job fields.
    EntryWithoutFields,
    /// `run_id` not a number.
    EntryNonNumericRun,
    /// `dispatch` missing.
    EntryWithoutDispatch,
    /// A run id Postgres has never seen.
    EntryUnknownRun,
    /// A field the job format does not have.
    EntryExtraField,
    /// A run id beyond 64 bits.
    EntryRunOverflow,
    /// A negative dispatch.
    EntryNegativeDispatch,
    /// Values that are not UTF-8.
    EntryNotUtf8,
    /// Empty values.
    EntryEmptyValues,
    /// `POST /runs` without a token.
    ApiNoToken,
    /// `POST /runs` with the wrong token.
    ApiWrongToken,
    /// A body that is not JSON.
    ApiNotJson,
    /// A body without `kind`.
    ApiNoKind,
    /// A body with a field the API does not know.
    ApiUnknownField,
    /// A kind outside `[a-z0-9_.-]{1,64}`.
    ApiBadKind,
    /// A body over the limit.
    ApiOversized,
    /// `POST /runs/abc/cancel`.
    ApiCancelBadId,
    /// Cancel of a run that does not exist.
    ApiCancelUnknown,
    /// `GET` of a run that does not exist.
    ApiGetUnknown,
    /// `GET /runs/abc`.
    ApiGetBadId,
    /// A route the API does not have.
    ApiNoRoute,
}

impl BadInput {
    /// Every kind.
    pub const ALL: [BadInput; 21] = [
        BadInput::EntryWithoutFields,
        BadInput::EntryNonNumericRun,
        BadInput::EntryWithoutDispatch,
        BadInput::EntryUnknownRun,
        BadInput::EntryExtraField,
        BadInput::EntryRunOverflow,
        BadInput::EntryNegativeDispatch,
        BadInput::EntryNotUtf8,
        BadInput::EntryEmptyValues,
        BadInput::ApiNoToken,
        BadInput::ApiWrongToken,
        BadInput::ApiNotJson,
        BadInput::ApiNoKind,
        BadInput::ApiUnknownField,
        BadInput::ApiBadKind,
        BadInput::ApiOversized,
        BadInput::ApiCancelBadId,
        BadInput::ApiCancelUnknown,
        BadInput::ApiGetUnknown,
        BadInput::ApiGetBadId,
        BadInput::ApiNoRoute,
    ];

    /// The raw fields of a malformed stream entry, or `None` for an API
    /// request.
    pub(super) fn entry(self) -> Option<Vec<(&'static [u8], Vec<u8>)>> {
        let f = |pairs: &[(&'static str, &[u8])]| {
            pairs
                .iter()
                .map(|(k, v)| (k.as_bytes(), v.to_vec()))
                .collect::<Vec<_>>()
        };
        Some(match self {
            BadInput::EntryWithoutFields => f(&[("garbage", b"1")]),
            BadInput::EntryNonNumericRun => f(&[("run_id", b"not-a-number"), ("dispatch", b"1")]),
            BadInput::EntryWithoutDispatch => f(&[("run_id", b"5")]),
            BadInput::EntryUnknownRun => f(&[("run_id", b"987654321"), ("dispatch", b"1")]),
            BadInput::EntryExtraField => {
                f(&[("run_id", b"1"), ("dispatch", b"1"), ("extra", b"x")])
            }
            BadInput::EntryRunOverflow => {
                f(&[("run_id", b"184467440737095516160000"), ("dispatch", b"1")])
            }
            BadInput::EntryNegativeDispatch => f(&[("run_id", b"1"), ("dispatch", b"-1")]),
            BadInput::EntryNotUtf8 => f(&[("run_id", b"\xff\xfe\x01"), ("dispatch", b"\xc3")]),
            BadInput::EntryEmptyValues => f(&[("run_id", b""), ("dispatch", b"")]),
            _ => return None,
        })
    }

    /// An API request: method, path, token, body, and the statuses that are
    /// a right answer (503 where the answer needs Postgres, which the
    /// nemesis may be restarting).
    pub(super) fn request(self) -> Option<Request> {
        let ok = Some(TOKEN);
        let post = "POST";
        Some(match self {
            BadInput::ApiNoToken => (
                post,
                "/runs".into(),
                None,
                r#"{"kind":"noop"}"#.into(),
                &[401],
            ),
            BadInput::ApiWrongToken => (
                post,
                "/runs".into(),
                Some("wrong"),
                r#"{"kind":"noop"}"#.into(),
                &[401],
            ),
            BadInput::ApiNotJson => (post, "/runs".into(), ok, "{not json".into(), &[400]),
            BadInput::ApiNoKind => (post, "/runs".into(), ok, r#"{"input":{}}"#.into(), &[422]),
            BadInput::ApiUnknownField => (
                post,
                "/runs".into(),
                ok,
                r#"{"kind":"noop","surprise":1}"#.into(),
                &[422],
            ),
            BadInput::ApiBadKind => (
                post,
                "/runs".into(),
                ok,
                r#"{"kind":"Bad Kind!"}"#.into(),
                &[400],
            ),
            BadInput::ApiOversized => (
                post,
                "/runs".into(),
                ok,
                format!(r#"{{"kind":"noop","input":"{}"}}"#, "x".repeat(10_000)),
                &[413],
            ),
            BadInput::ApiCancelBadId => {
                (post, "/runs/abc/cancel".into(), ok, String::new(), &[400])
            }
            BadInput::ApiCancelUnknown => (
                post,
                "/runs/987654321/cancel".into(),
                ok,
                String::new(),
                &[404, 503],
            ),
            BadInput::ApiGetUnknown => (
                "GET",
                "/runs/987654321".into(),
                ok,
                String::new(),
                &[404, 503],
            ),
            BadInput::ApiGetBadId => ("GET", "/runs/abc".into(), ok, String::new(), &[400]),
            BadInput::ApiNoRoute => (post, "/nowhere".into(), ok, String::new(), &[404]),
            _ => return None,
        })
    }
}

/// A bad API request: method, path, token, body, the right answers.
pub(super) type Request = (
    &'static str,
    String,
    Option<&'static str>,
    String,
    &'static [u16],
);
