//! Who is calling, whose key goes upstream, and which secrets must never leave.
//!
//! A gateway in front of a real provider holds two kinds of secret: the operator's upstream keys
//! (read once from the environment) and the keys clients send with each request. Three things
//! follow, and this module is where each is decided:
//!
//! - **Inbound keys.** When the config lists `inbound_keys` (hashed: only the SHA-256 of a key is
//!   ever written down), a request without a listed key is a 401 in OpenAI's shape. The key id
//!   names the caller's tenant.
//! - **Credentials.** What the client sent (`Authorization` or `api-key`, `OpenAI-Organization`,
//!   `OpenAI-Project`) is kept as [`Credentials`]; each upstream's `auth` mode decides whether
//!   they, the operator's key or nothing goes to it (see `upstream`). A key that authenticated
//!   the client to the gateway is never forwarded.
//! - **Redaction.** Providers quote keys in error messages. Every known key — the operator's and
//!   the client's — is replaced by `[redacted]` in whatever the gateway sends to a client or
//!   writes to its trace ([`Redactor`]).
//!
//! The tenant is what scopes run state: the inbound key id, else a hash of the client's own
//! key, else `anonymous`. It is never the key itself.

use std::borrow::Cow;
use std::collections::HashMap;
use std::sync::Arc;

use axum::http::{HeaderMap, HeaderValue, StatusCode};
use sha2::{Digest, Sha256};

use crate::error::ApiError;

/// Keys shorter than this are not redacted (a test key like `x` would blank every answer).
pub(crate) const MIN_SECRET_LEN: usize = 8;

/// What replaces a secret.
pub(crate) const REDACTED: &str = "[redacted]";

/// Lowercase hex of `bytes`.
pub(crate) fn hex(bytes: &[u8]) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut s = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        s.push(char::from(DIGITS[usize::from(b >> 4)]));
        s.push(char::from(DIGITS[usize::from(b & 15)]));
    }
    s
}

/// The lowercase hex SHA-256 of `key`: how inbound keys are written in the config.
pub fn key_hash(key: &str) -> String {
    hex(&Sha256::digest(key.as_bytes()))
}

/// The client's credentials, as sent, for upstreams with `auth = "client"`.
#[derive(Debug, Clone, Default)]
pub struct Credentials {
    /// `Authorization`, unless it carried the gateway's own inbound key.
    pub authorization: Option<HeaderValue>,
    /// `api-key` (Azure's spelling), unless it carried the gateway's own inbound key.
    pub api_key: Option<HeaderValue>,
    /// `OpenAI-Organization`.
    pub organization: Option<HeaderValue>,
    /// `OpenAI-Project`.
    pub project: Option<HeaderValue>,
}

/// The caller of one request.
#[derive(Debug, Clone)]
pub struct Caller {
    /// The tenant runs are scoped to: `key:ID` for an inbound key, `client:HASH` for the
    /// client's own key, `anonymous` without either.
    pub tenant: String,
    /// What may be forwarded upstream.
    pub credentials: Credentials,
    /// Every secret of this request: the operator's keys and the client's.
    pub redactor: Redactor,
}

/// Replaces known secrets with [`REDACTED`].
#[derive(Debug, Clone, Default)]
pub struct Redactor {
    global: Arc<Vec<String>>,
    local: Vec<String>,
}

impl Redactor {
    /// Redacts `secrets` (those shorter than [`MIN_SECRET_LEN`] are ignored).
    pub fn new(secrets: impl IntoIterator<Item = String>) -> Redactor {
        Redactor {
            global: Arc::new(
                secrets
                    .into_iter()
                    .filter(|s| s.len() >= MIN_SECRET_LEN)
                    .collect(),
            ),
            local: Vec::new(),
        }
    }

    /// This redactor plus one more secret (ignored when short).
    pub fn with(&self, secret: &str) -> Redactor {
        let mut r = self.clone();
        if secret.len() >= MIN_SECRET_LEN && !r.local.iter().any(|s| s == secret) {
            r.local.push(secret.to_owned());
        }
        r
    }

    fn secrets(&self) -> impl Iterator<Item = &str> {
        self.global.iter().chain(&self.local).map(String::as_str)
    }

    /// `text` with every secret replaced.
    pub fn text<'t>(&self, text: &'t str) -> Cow<'t, str> {
        let mut out = Cow::Borrowed(text);
        for s in self.secrets() {
            if out.contains(s) {
                out = Cow::Owned(out.replace(s, REDACTED));
            }
        }
        out
    }

    /// `bytes` with every secret replaced (the same buffer when none occurs).
    pub fn bytes(&self, bytes: bytes::Bytes) -> bytes::Bytes {
        let mut out: Option<Vec<u8>> = None;
        for s in self.secrets() {
            let hay = out.as_deref().unwrap_or(&bytes);
            if find(hay, s.as_bytes()).is_some() {
                out = Some(replace_all(hay, s.as_bytes(), REDACTED.as_bytes()));
            }
        }
        out.map_or(bytes, bytes::Bytes::from)
    }

    /// Redacts every string in `value`, keys included.
    pub fn value(&self, value: &mut serde_json::Value) {
        use serde_json::Value;
        if self.global.is_empty() && self.local.is_empty() {
            return;
        }
        match value {
            Value::String(s) => {
                if let Cow::Owned(r) = self.text(s) {
                    *s = r;
                }
            }
            Value::Array(a) => a.iter_mut().for_each(|v| self.value(v)),
            Value::Object(o) => {
                let leaked: Vec<String> = o
                    .keys()
                    .filter(|k| matches!(self.text(k), Cow::Owned(_)))
                    .cloned()
                    .collect();
                for k in leaked {
                    if let Some(v) = o.remove(&k) {
                        o.insert(self.text(&k).into_owned(), v);
                    }
                }
                o.values_mut().for_each(|v| self.value(v));
            }
            Value::Null | Value::Bool(_) | Value::Number(_) => {}
        }
    }

    /// A trace event's details with every secret removed: a raw text is kept as it is when no
    /// secret can be in it, and read into a value and cleaned otherwise.
    pub fn detail(&self, detail: crate::store::Detail) -> crate::store::Detail {
        use crate::store::Detail;
        match detail {
            Detail::Value(mut v) => {
                self.value(&mut v);
                Detail::Value(v)
            }
            Detail::Raw(r) if self.leaves_json_alone(r.get().as_bytes()) => Detail::Raw(r),
            raw @ Detail::Raw(_) => {
                let mut v = raw.to_value();
                self.value(&mut v);
                Detail::Value(v)
            }
        }
    }

    /// Whether [`Redactor::value`] would leave the JSON document `json` (as text) unchanged:
    /// no secret occurs in it. Errs towards `false`: a `\u` or `\/` escape anywhere could spell
    /// a secret the raw text does not show, and a secret with a character JSON must escape
    /// (a quote, a backslash, a control character) is never looked for in the raw text.
    pub fn leaves_json_alone(&self, json: &[u8]) -> bool {
        let mut secrets = self.secrets().peekable();
        if secrets.peek().is_none() {
            return true;
        }
        if find(json, b"\\u").is_some() || find(json, b"\\/").is_some() {
            return false;
        }
        secrets.all(|s| {
            !s.bytes().any(|b| b == b'"' || b == b'\\' || b < 0x20)
                && find(json, s.as_bytes()).is_none()
        })
    }

    /// An error with every secret removed from its message and reasons.
    pub fn error(&self, mut e: ApiError) -> ApiError {
        e.message = self.text(&e.message).into_owned();
        for r in &mut e.reasons {
            *r = self.text(r).into_owned();
        }
        e
    }
}

fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    if needle.is_empty() {
        return None;
    }
    memchr::memmem::find(hay, needle)
}

fn replace_all(hay: &[u8], needle: &[u8], with: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(hay.len());
    let mut rest = hay;
    while let Some(i) = find(rest, needle) {
        out.extend_from_slice(&rest[..i]);
        out.extend_from_slice(with);
        rest = &rest[i + needle.len()..];
    }
    out.extend_from_slice(rest);
    out
}

/// The gateway's inbound keys (by hash) and the operator's secrets.
#[derive(Debug, Default)]
pub struct Gatekeeper {
    /// Key id by the SHA-256 hex of the key.
    keys: HashMap<String, String>,
    /// The operator's secrets.
    redactor: Redactor,
}

/// Where a client's key was found.
#[derive(Clone, Copy, PartialEq, Eq)]
enum KeySource {
    SelfhealKey,
    Authorization,
    ApiKey,
}

impl Gatekeeper {
    /// Inbound keys as `id → sha256 hex` (from the config) and the operator's secrets.
    pub fn new<'a>(
        inbound: impl IntoIterator<Item = (&'a String, &'a String)>,
        secrets: impl IntoIterator<Item = String>,
    ) -> Gatekeeper {
        Gatekeeper {
            keys: inbound
                .into_iter()
                .map(|(id, hash)| (hash.to_ascii_lowercase(), id.clone()))
                .collect(),
            redactor: Redactor::new(secrets),
        }
    }

    /// Whether the gateway asks clients for a key.
    pub fn requires_key(&self) -> bool {
        !self.keys.is_empty()
    }

    /// The operator's secrets alone (for answers before the caller is known).
    pub fn redactor(&self) -> &Redactor {
        &self.redactor
    }

    /// Identifies the caller: 401 when a key is required and none listed was sent.
    pub fn admit(&self, headers: &HeaderMap) -> Result<Caller, ApiError> {
        let bearer = header_str(headers, "authorization").map(|v| {
            v.strip_prefix("Bearer ")
                .or_else(|| v.strip_prefix("bearer "))
                .unwrap_or(v)
                .trim()
        });
        let api_key = header_str(headers, "api-key").map(str::trim);
        let candidates = [
            (
                KeySource::SelfhealKey,
                header_str(headers, "x-selfheal-key").map(str::trim),
            ),
            (KeySource::Authorization, bearer),
            (KeySource::ApiKey, api_key),
        ];
        let mut credentials = Credentials {
            authorization: headers.get("authorization").cloned().map(sensitive),
            api_key: headers.get("api-key").cloned().map(sensitive),
            organization: headers.get("openai-organization").cloned(),
            project: headers.get("openai-project").cloned(),
        };
        let mut redactor = self.redactor.clone();
        for (_, key) in &candidates {
            if let Some(k) = key {
                redactor = redactor.with(k);
            }
        }
        let tenant = if self.requires_key() {
            let found = candidates.iter().find_map(|(src, key)| {
                let key = (*key).filter(|k| !k.is_empty())?;
                self.keys.get(&key_hash(key)).map(|id| (*src, id))
            });
            let Some((src, id)) = found else {
                return Err(unauthorized());
            };
            match src {
                KeySource::Authorization => credentials.authorization = None,
                KeySource::ApiKey => credentials.api_key = None,
                KeySource::SelfhealKey => {}
            }
            format!("key:{id}")
        } else {
            match bearer.or(api_key).filter(|k| !k.is_empty()) {
                Some(k) => format!("client:{}", &key_hash(k)[..16]),
                None => "anonymous".to_owned(),
            }
        };
        Ok(Caller {
            tenant,
            credentials,
            redactor,
        })
    }
}

fn header_str<'h>(headers: &'h HeaderMap, name: &str) -> Option<&'h str> {
    headers.get(name).and_then(|v| v.to_str().ok())
}

fn sensitive(mut v: HeaderValue) -> HeaderValue {
    v.set_sensitive(true);
    v
}

/// 401 in OpenAI's shape.
pub(crate) fn unauthorized() -> ApiError {
    ApiError::new(
        StatusCode::UNAUTHORIZED,
        "invalid_request_error",
        "invalid_api_key",
        "This gateway needs an API key: send one of its keys as `Authorization: Bearer KEY`, \
         `api-key: KEY` or `x-selfheal-key: KEY`.",
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn headers(pairs: &[(&'static str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.insert(*k, HeaderValue::from_str(v).unwrap());
        }
        h
    }

    #[test]
    fn raw_trace_details_lose_their_secrets_and_clean_ones_stay_raw() {
        use crate::store::Detail;
        let r = Redactor::new(["sk-upstream-secret".to_string()]);
        #[derive(serde::Serialize)]
        struct D<'a> {
            model: &'a str,
        }
        let leaked = r.detail(Detail::of(&D {
            model: "gpt sk-upstream-secret",
        }));
        let text = leaked.to_value().to_string();
        assert!(!text.contains("sk-upstream-secret"), "{text}");
        assert!(text.contains("gpt"), "{text}");
        let clean = r.detail(Detail::of(&D { model: "gpt" }));
        assert!(matches!(clean, Detail::Raw(_)));
        assert_eq!(clean.to_value(), json!({"model": "gpt"}));
    }

    #[test]
    fn inbound_key_is_required_checked_by_hash_and_not_forwarded() {
        let keys = [("alice".to_string(), key_hash("sk-gateway-alice"))];
        let g = Gatekeeper::new(keys.iter().map(|(a, b)| (a, b)), []);
        assert_eq!(
            g.admit(&HeaderMap::new()).unwrap_err().status,
            StatusCode::UNAUTHORIZED
        );
        let wrong = headers(&[("authorization", "Bearer sk-gateway-bob")]);
        assert_eq!(g.admit(&wrong).unwrap_err().code, "invalid_api_key");
        let ok = headers(&[
            ("authorization", "Bearer sk-gateway-alice"),
            ("openai-project", "proj_1"),
        ]);
        let c = g.admit(&ok).unwrap();
        assert_eq!(c.tenant, "key:alice");
        assert!(
            c.credentials.authorization.is_none(),
            "the gateway key stays here"
        );
        assert!(c.credentials.project.is_some());
        // With the gateway key in its own header, the client's provider key goes on.
        let both = headers(&[
            ("x-selfheal-key", "sk-gateway-alice"),
            ("authorization", "Bearer sk-provider-123"),
        ]);
        let c = g.admit(&both).unwrap();
        assert_eq!(c.tenant, "key:alice");
        assert!(c.credentials.authorization.is_some());
        assert_eq!(
            c.redactor.text("a sk-provider-123 b sk-gateway-alice"),
            "a [redacted] b [redacted]"
        );
    }

    #[test]
    fn without_inbound_keys_the_tenant_is_a_hash_of_the_clients_key() {
        let g = Gatekeeper::new([], []);
        let a = g
            .admit(&headers(&[("authorization", "Bearer sk-client-aaaa")]))
            .unwrap();
        let b = g.admit(&headers(&[("api-key", "sk-client-bbbb")])).unwrap();
        assert!(a.tenant.starts_with("client:") && !a.tenant.contains("aaaa"));
        assert_ne!(a.tenant, b.tenant);
        assert_eq!(g.admit(&HeaderMap::new()).unwrap().tenant, "anonymous");
    }

    #[test]
    fn redaction_covers_text_bytes_values_and_errors() {
        let r = Redactor::new(["sk-operator-secret".to_string(), "short".to_string()]);
        assert_eq!(r.text("key sk-operator-secret!"), "key [redacted]!");
        assert_eq!(r.text("short stays"), "short stays");
        let b = r.bytes(bytes::Bytes::from_static(b"xsk-operator-secretx"));
        assert_eq!(&b[..], b"x[redacted]x");
        let mut v = json!({"a": ["sk-operator-secret"], "sk-operator-secret": 1});
        r.value(&mut v);
        assert_eq!(v, json!({"a": ["[redacted]"], "[redacted]": 1}));
        let e = r.error(ApiError::exhausted(vec![
            "bad key sk-operator-secret".into(),
        ]));
        assert!(!e.body().to_string().contains("sk-operator-secret"));
    }
}
