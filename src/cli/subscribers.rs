//! `eventrelay subscribers ...`: who is connected to a running relay, and
//! ending a subscriber's streams on every relay, through the admin API
//! (and so with the configured `admin.token`).

use clap::{Args, Subcommand};
use reqwest::Method;

use super::{AdminCall, CliError, ConfigArgs};

#[derive(Subcommand)]
pub enum SubscribersCommand {
    /// List the streams open on the relay at --url, oldest first (JSON).
    List(ListArgs),
    /// End a subscriber's streams on every relay now, optionally refusing
    /// new ones for a while (JSON: how many streams this relay ended).
    Disconnect(DisconnectArgs),
}

#[derive(Args)]
pub struct ListArgs {
    #[command(flatten)]
    pub config: ConfigArgs,
    /// The running relay.
    #[arg(long, default_value = "http://127.0.0.1:8080")]
    pub url: String,
    /// Only streams of this scope.
    #[arg(long)]
    scope: Option<String>,
    /// Streams after this id (the `next` of the previous page).
    #[arg(long)]
    after: Option<u64>,
    /// Streams per page (1 to 500).
    #[arg(long, default_value_t = 100)]
    limit: usize,
}

#[derive(Args)]
pub struct DisconnectArgs {
    #[command(flatten)]
    pub config: ConfigArgs,
    /// The running relay (any one: the others follow within a second).
    #[arg(long, default_value = "http://127.0.0.1:8080")]
    pub url: String,
    /// The subscriber id, as its tokens name it.
    subscriber: String,
    /// Only its streams of this scope.
    #[arg(long)]
    scope: Option<String>,
    /// Also refuse its new streams for this many seconds.
    #[arg(long)]
    deny_secs: Option<u64>,
}

pub async fn run(command: SubscribersCommand) -> Result<(), CliError> {
    let answer = match command {
        SubscribersCommand::List(args) => {
            let mut query = vec![format!("limit={}", args.limit)];
            if let Some(scope) = &args.scope {
                query.push(format!("scope={}", encode(scope)));
            }
            if let Some(after) = args.after {
                query.push(format!("after={after}"));
            }
            let path = format!("/v1/admin/subscribers?{}", query.join("&"));
            AdminCall::new(&args.config, &args.url)?
                .send(Method::GET, &path)
                .await?
        }
        SubscribersCommand::Disconnect(args) => {
            let mut query = Vec::new();
            if let Some(scope) = &args.scope {
                query.push(format!("scope={}", encode(scope)));
            }
            if let Some(secs) = args.deny_secs {
                query.push(format!("denySecs={secs}"));
            }
            let path = format!(
                "/v1/admin/subscribers/{}/disconnect?{}",
                encode(&args.subscriber),
                query.join("&")
            );
            AdminCall::new(&args.config, &args.url)?
                .send(Method::POST, &path)
                .await?
        }
    };
    println!("{answer}");
    Ok(())
}

/// Percent-encodes a path segment or query value: every byte but the
/// unreserved ones (RFC 3986).
fn encode(text: &str) -> String {
    text.bytes()
        .map(|byte| {
            if byte.is_ascii_alphanumeric() || b"-._~".contains(&byte) {
                char::from(byte).to_string()
            } else {
                format!("%{byte:02X}")
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    #[test]
    fn only_unreserved_bytes_pass_unencoded() {
        assert_eq!(super::encode("org-1_a.b~"), "org-1_a.b~");
        assert_eq!(super::encode("a/b c?é"), "a%2Fb%20c%3F%C3%A9");
    }
}
