//! Label Studio's API, as `connect`'s sync and routing use it (blocking,
//! on their own threads). Two kinds of token: a legacy API token
//! (`Authorization: Token …`) and a personal access token, a JWT refresh
//! token exchanged at `POST /api/token/refresh/` for short-lived access
//! tokens (`Authorization: Bearer …`, 5 minutes in 1.23), refreshed when
//! one is refused. docs/label-studio.md has the calls as measured.

use std::sync::Mutex;
use std::time::Duration;

use serde_json::Value;
use ureq::Agent;

use super::error::ConnectError;

/// One call's limit (Label Studio on another host, a slow export).
const CALL_TIMEOUT: Duration = Duration::from_secs(30);
/// Tasks per page when listing a project's tasks.
pub const PAGE_SIZE: u32 = 100;

pub struct Client {
    base: String,
    token: String,
    /// A personal access token's current access token.
    access: Mutex<Option<String>>,
    agent: Agent,
}

/// An answer that is not 2xx.
#[derive(Debug)]
pub enum CallError {
    /// 404: the object is gone.
    NotFound,
    Other(ConnectError),
}

impl From<ConnectError> for CallError {
    fn from(e: ConnectError) -> Self {
        CallError::Other(e)
    }
}

impl Client {
    pub fn new(url: &str, token: &str) -> Client {
        let agent: Agent = Agent::config_builder()
            .timeout_global(Some(CALL_TIMEOUT))
            .http_status_as_error(false)
            .build()
            .into();
        Client {
            base: url.trim_end_matches('/').to_owned(),
            token: token.to_owned(),
            access: Mutex::new(None),
            agent,
        }
    }

    /// A personal access token is a JWT (three dot-separated parts); a
    /// legacy token is 40 hex digits.
    fn is_personal_access_token(&self) -> bool {
        self.token.split('.').count() == 3
    }

    fn authorization(&self, refresh: bool) -> Result<String, ConnectError> {
        if !self.is_personal_access_token() {
            return Ok(format!("Token {}", self.token));
        }
        let mut access = self.access.lock().unwrap_or_else(|p| p.into_inner());
        if refresh || access.is_none() {
            let url = format!("{}/api/token/refresh/", self.base);
            let mut r = self
                .agent
                .post(&url)
                .send_json(serde_json::json!({ "refresh": self.token }))
                .map_err(|e| ConnectError::unanswered(format!("POST {url}"), e))?;
            let status = r.status().as_u16();
            let body: Value = r.body_mut().read_json().unwrap_or(Value::Null);
            match body["access"].as_str() {
                Some(a) if status == 200 => *access = Some(a.to_owned()),
                _ => {
                    return Err(ConnectError::TokenRefused {
                        status,
                        body: body.to_string(),
                    })
                }
            }
        }
        Ok(format!("Bearer {}", access.as_deref().unwrap_or_default()))
    }

    /// `method path` with `body` (JSON) if any: the answer's JSON. A
    /// refused access token is refreshed once.
    fn call(&self, method: &str, path: &str, body: Option<&Value>) -> Result<Value, CallError> {
        let url = format!("{}{path}", self.base);
        for attempt in 0..2 {
            let auth = self.authorization(attempt > 0)?;
            let result = match (method, body) {
                ("PATCH", Some(b)) => self
                    .agent
                    .patch(&url)
                    .header("Authorization", &auth)
                    .send_json(b),
                ("POST", Some(b)) => self
                    .agent
                    .post(&url)
                    .header("Authorization", &auth)
                    .send_json(b),
                _ => self.agent.get(&url).header("Authorization", &auth).call(),
            };
            let mut r =
                result.map_err(|e| ConnectError::unanswered(format!("{method} {url}"), e))?;
            let status = r.status().as_u16();
            if status == 401 && attempt == 0 && self.is_personal_access_token() {
                continue;
            }
            if status == 404 {
                return Err(CallError::NotFound);
            }
            let text = r.body_mut().read_to_string().unwrap_or_default();
            if !(200..300).contains(&status) {
                let cut: String = text.chars().take(300).collect();
                return Err(CallError::Other(ConnectError::Answer {
                    call: format!("{method} {url}"),
                    status,
                    body: cut,
                }));
            }
            return Ok(serde_json::from_str(&text).unwrap_or(Value::Null));
        }
        Err(CallError::Other(ConnectError::Answer {
            call: format!("{method} {url}"),
            status: 401,
            body: "the access token was refused after a refresh".to_owned(),
        }))
    }

    pub fn get(&self, path: &str) -> Result<Value, CallError> {
        self.call("GET", path, None)
    }

    pub fn patch(&self, path: &str, body: &Value) -> Result<Value, CallError> {
        self.call("PATCH", path, Some(body))
    }

    /// The ids of every project the token can read.
    pub fn project_ids(&self) -> Result<Vec<i64>, CallError> {
        let mut ids = Vec::new();
        for page in 1.. {
            let v = self.get(&format!("/api/projects/?page={page}&page_size={PAGE_SIZE}"));
            let v = match v {
                Err(CallError::NotFound) if page > 1 => break,
                other => other?,
            };
            // Paginated ({"results": [...], "next": …}) or a plain list.
            let (items, more) = match &v {
                Value::Array(a) => (a.clone(), false),
                _ => (
                    v["results"].as_array().cloned().unwrap_or_default(),
                    !v["next"].is_null(),
                ),
            };
            ids.extend(items.iter().filter_map(|p| p["id"].as_i64()));
            if !more || items.is_empty() {
                break;
            }
        }
        Ok(ids)
    }

    pub fn project(&self, id: i64) -> Result<Value, CallError> {
        self.get(&format!("/api/projects/{id}/"))
    }

    /// The tasks of `project` updated at or after `since` (Label Studio's
    /// clock), oldest first, with their annotations (skipped ones too), at
    /// most [`PAGE_SIZE`]; `page` counts pages of tasks updated at the same
    /// `since`. The caller pages by key: the next call starts at the last
    /// task's `updated_at` (page numbers alone would skip a task updated
    /// during the sync, as it moves to the end).
    pub fn tasks_since(
        &self,
        project: i64,
        since: &str,
        page: u32,
    ) -> Result<Vec<Value>, CallError> {
        let query = serde_json::json!({
            "filters": {"conjunction": "and", "items": [{
                "filter": "filter:tasks:updated_at",
                "operator": "greater_or_equal",
                "type": "Datetime",
                "value": since,
            }]},
            "ordering": ["tasks:updated_at"],
        });
        let v = self.get(&format!(
            "/api/tasks/?project={project}&fields=all&page={page}&page_size={PAGE_SIZE}\
             &include=id,data,updated_at,annotations,completed_by,was_cancelled,result\
             &query={}",
            percent_encode(&query.to_string())
        ));
        let v = match v {
            // Past the last page.
            Err(CallError::NotFound) => return Ok(Vec::new()),
            other => other?,
        };
        Ok(v["tasks"].as_array().cloned().unwrap_or_default())
    }
}

/// A query parameter's value, percent-encoded (RFC 3986 unreserved kept).
fn percent_encode(s: &str) -> String {
    const VALUE: &percent_encoding::AsciiSet = &percent_encoding::NON_ALPHANUMERIC
        .remove(b'-')
        .remove(b'_')
        .remove(b'.')
        .remove(b'~');
    percent_encoding::utf8_percent_encode(s, VALUE).to_string()
}

/// An instant as Label Studio's task filter takes it (exactly
/// `%Y-%m-%dT%H:%M:%S.%fZ`; any other form is a 500).
pub fn filter_time(t: crate::time::Nanos) -> String {
    let s = crate::time::format_timestamp(t);
    // format_timestamp: "YYYY-MM-DDThh:mm:ss[.fffffffff]Z".
    let (whole, frac) = match s.trim_end_matches('Z').split_once('.') {
        Some((w, f)) => (w.to_owned(), f.to_owned()),
        None => (s.trim_end_matches('Z').to_owned(), String::new()),
    };
    let micros: String = frac.chars().chain(std::iter::repeat('0')).take(6).collect();
    format!("{whole}.{micros}Z")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn filter_times_have_six_fraction_digits() {
        let t = |s: &str| crate::time::parse_timestamp(s).unwrap();
        assert_eq!(
            filter_time(t("2026-11-26T01:19:30Z")),
            "2026-11-26T01:19:30.000000Z"
        );
        assert_eq!(
            filter_time(t("2026-11-26T01:19:30.123456789Z")),
            "2026-11-26T01:19:30.123456Z"
        );
        assert_eq!(percent_encode("a b{\"x\"}"), "a%20b%7B%22x%22%7D");
    }
}
