//! `eventrelay token`: development tokens for the configured HMAC secret.

use std::path::Path;
use std::time::Duration;

use clap::Args;
use eventrelay::auth::{AuthConfig, JwtConfig, MintOptions, TokenSpec, mint_token};
use eventrelay::config::Config;

use super::{CliError, ConfigArgs, DEV_DIR, dev_secret, parse_json};

#[derive(Args)]
pub struct TokenArgs {
    #[command(flatten)]
    pub config: ConfigArgs,
    /// Subscriber id (the `sub` claim by default).
    #[arg(long)]
    subscriber: String,
    /// Scope key the subscriber belongs to; repeat it to grant several
    /// (the scope claim is then an array).
    #[arg(long, required = true)]
    scope: Vec<String>,
    /// Grants as JSON, such as '{"orders":["read"]}'.
    #[arg(long, default_value = "{}")]
    grants: String,
    /// Lifetime in seconds.
    #[arg(long, default_value_t = 3600)]
    ttl_secs: u64,
}

/// Mints a token and prints it.
pub fn token(args: TokenArgs) -> Result<(), CliError> {
    let config = Config::load(args.config.config.as_deref())?;
    let (secret, jwt) = match &config.auth {
        Some(AuthConfig::Jwt(jwt)) => (
            jwt.secret.clone().ok_or_else(|| {
                CliError::Usage(
                    "auth.jwt.secret is not set: tokens can only be minted for HMAC secrets".into(),
                )
            })?,
            jwt.clone(),
        ),
        Some(AuthConfig::Forward(_)) => {
            return Err(CliError::Usage(
                "auth.mode is `forward`: the application issues credentials, not eventrelay".into(),
            ));
        }
        None | Some(AuthConfig::Development(_)) => (
            dev_secret(Path::new(DEV_DIR), "jwt-secret")?,
            JwtConfig::default(),
        ),
    };
    let grants = parse_json("grants", &args.grants)?;
    let token = mint_token(
        &secret,
        jwt.algorithm,
        &TokenSpec {
            subscriber_id: args.subscriber,
            scope_key: args.scope[0].clone(),
            more_scopes: args.scope[1..].to_vec(),
            grants,
            ttl: Duration::from_secs(args.ttl_secs),
        },
        &MintOptions::from_config(&jwt),
    )?;
    println!("{token}");
    Ok(())
}
