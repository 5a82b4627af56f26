//! Why a connection attempt failed or the client stopped.

use std::time::Duration;

/// Boxed errors from the application's own hooks (request builder, token
/// provider, token refresh), which the client only reports.
pub type BoxError = Box<dyn std::error::Error + Send + Sync + 'static>;

#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// 401 or 403: the credentials were refused. Terminal, unless a token
    /// refresh hook is configured, which gets one chance to fix them.
    #[error("the relay refused the credentials ({status}{})", code_suffix(.code))]
    Unauthorized { status: u16, code: Option<String> },
    /// A 4xx other than 401, 403, 408 and 429: retrying the same request
    /// cannot succeed, so it is terminal.
    #[error("the relay refused the request ({status}{})", code_suffix(.code))]
    Rejected { status: u16, code: Option<String> },
    /// 408, 429 or 5xx: retried with backoff.
    #[error("the relay is unavailable ({status}{})", code_suffix(.code))]
    Unavailable { status: u16, code: Option<String> },
    /// A 200 whose body is not an event stream (a proxy's login page, say).
    #[error("the response is not an event stream (content-type {0:?})")]
    NotEventStream(String),
    /// No byte, not even a heartbeat, arrived for this long.
    #[error("no data from the relay for {0:?}")]
    Idle(Duration),
    /// The stream ended before the relay said it was ready.
    #[error("the stream ended before the relay was ready")]
    EndedEarly,
    /// The application's request builder failed; retried with backoff, as
    /// a credential store may be briefly unreachable.
    #[error("building the request failed: {0}")]
    BuildRequest(#[source] BoxError),
    /// The request itself is malformed (an invalid URL or header): no retry
    /// can fix it, so it is terminal.
    #[error("invalid request: {0}")]
    InvalidRequest(#[source] reqwest::Error),
    /// The token provider failed, or gave a token that is not a valid
    /// header value; retried with backoff, as an identity provider may be
    /// briefly unreachable.
    #[error("fetching a token failed: {0}")]
    Token(#[source] BoxError),
    /// The application's token refresh hook failed.
    #[error("refreshing the credentials failed: {0}")]
    Refresh(#[source] BoxError),
    /// Connecting, sending or reading failed.
    #[error("HTTP error: {0}")]
    Http(#[from] reqwest::Error),
}

fn code_suffix(code: &Option<String>) -> String {
    code.as_ref().map(|c| format!(", {c}")).unwrap_or_default()
}

impl ClientError {
    /// Whether the client gives up on this error instead of reconnecting.
    pub fn is_terminal(&self) -> bool {
        matches!(
            self,
            ClientError::Unauthorized { .. }
                | ClientError::Rejected { .. }
                | ClientError::InvalidRequest(_)
                | ClientError::Refresh(_)
        )
    }

    /// The HTTP status the relay answered with, if the error is a refusal.
    pub fn status(&self) -> Option<u16> {
        match self {
            ClientError::Unauthorized { status, .. }
            | ClientError::Rejected { status, .. }
            | ClientError::Unavailable { status, .. } => Some(*status),
            _ => None,
        }
    }
}
