//! `eventrelay serve`, `check-config` and `health`: running the relay,
//! checking its configuration, and probing a running one.

use std::io::Write as _;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use clap::Args;
use eventrelay::auth::{Algorithm, AuthConfig, JwtConfig, SubscriberResolver, build_resolver};
use eventrelay::config::Config;
use eventrelay::reload::Reloading;
use eventrelay::store::{WakeupMode, wakeup};

use super::{AdminCall, CliError, ConfigArgs, DEV_DIR, dev_secret, init_logging};

#[derive(Args)]
pub struct HealthArgs {
    /// The endpoint to check.
    #[arg(long, default_value = "http://127.0.0.1:8080/readyz")]
    url: String,
}

/// Exits with an error unless `args.url` answers with a success status.
pub async fn health(args: HealthArgs) -> Result<(), CliError> {
    let unreachable = |source| CliError::Unreachable {
        url: args.url.clone(),
        source,
    };
    let client = reqwest::Client::builder()
        .timeout(Duration::from_secs(3))
        .build()
        .map_err(unreachable)?;
    let response = client.get(&args.url).send().await.map_err(unreachable)?;
    if !response.status().is_success() {
        return Err(CliError::Unhealthy {
            url: args.url,
            status: response.status(),
        });
    }
    Ok(())
}

/// Loads and validates the configuration as `serve` would, then prints it.
/// In the logical wake-up mode it also asks the database whether it can
/// serve that mode, since most of what can go wrong there is server-side.
pub async fn check_config(args: ConfigArgs) -> Result<(), CliError> {
    let config = Config::load(args.config.as_deref())?;
    if let Some(auth) = &config.auth
        && !config.development_mode()
    {
        build_resolver(auth)?;
    }
    if config.http.tls.enabled() {
        // Reads and pairs the files, as the server does at start.
        eventrelay::http::tls::server_config(&config.http.tls)?;
    }
    if let (WakeupMode::Logical, Some(url)) = (config.database.wakeup, &config.database.url) {
        let client = config.connect_options(url)?.connect().await?;
        if config.database.migrate {
            // `serve` records the mode when it migrates; only the server's
            // side can be wrong yet.
            wakeup::check_logical_server(&client).await?;
        } else {
            wakeup::check_ready(&client, &config.schema(), WakeupMode::Logical).await?;
        }
    }
    println!("configuration is valid:");
    println!("{config:#?}");
    Ok(())
}

pub async fn serve(args: ConfigArgs) -> Result<(), CliError> {
    let mut config = Config::load(args.config.as_deref())?;
    let log_filter = init_logging(&config.log);
    raise_file_limit();
    let development = config.development_mode();
    let resolver: Arc<dyn SubscriberResolver> = match &config.auth {
        Some(auth) if !development => build_resolver(auth)?,
        _ => {
            let secret = dev_secret(Path::new(DEV_DIR), "jwt-secret")?;
            config.development_secret = Some(secret.clone());
            build_resolver(&AuthConfig::Jwt(JwtConfig {
                algorithm: Algorithm::HS256,
                secret: Some(secret),
                ..JwtConfig::default()
            }))?
        }
    };
    if development && config.publish.token.is_none() {
        config.publish.token = Some(dev_secret(Path::new(DEV_DIR), "publish-token")?);
    }
    let shutdown = shutdown_signal()?;
    let reloading = reloading(args.config.clone(), &config, log_filter)?;
    let listener = eventrelay::server::bind(&config.http)?;
    // The banner is best effort: a closed stdout must not stop the service.
    let mut out = std::io::stdout();
    let address = listener.local_addr()?;
    let scheme = if config.http.tls.enabled() {
        "https"
    } else {
        "http"
    };
    let _ = writeln!(out, "eventrelay listening on {scheme}://{address}");
    let database = match &config.database.url {
        Some(url) => url.redacted(),
        None => format!(
            "embedded, in {} (single session; set DATABASE_URL for a real Postgres)",
            config.database.embedded_dir
        ),
    };
    let _ = writeln!(out, "  database: {database}");
    let _ = writeln!(
        out,
        "  stream:  GET  {scheme}://{address}/v1/events   (Authorization: Bearer <token>)"
    );
    let _ = writeln!(out, "  publish: POST {scheme}://{address}/v1/events");
    if development {
        let _ = writeln!(
            out,
            "DEVELOPMENT MODE: anyone who can reach this relay can mint a token for any scope \
             (tokens are signed with a throwaway secret in {DEV_DIR}/jwt-secret); configure [auth] \
             before it serves anyone else"
        );
        let _ = writeln!(
            out,
            "  subscriber token: eventrelay token --subscriber alice --scope org-1"
        );
        let _ = writeln!(out, "  publish token:    cat {DEV_DIR}/publish-token");
        if config.http.inspector {
            let _ = writeln!(out, "  inspector:        {scheme}://{address}/inspector");
        }
    }
    eventrelay::server::run_with(config, resolver, listener, shutdown, Some(reloading)).await?;
    Ok(())
}

/// Reloads from the same file and environment as at start, on SIGHUP and
/// on `POST /v1/admin/reload`. Development mode's generated publish token
/// is kept, so a reload does not report it as changed.
fn reloading(
    file: Option<std::path::PathBuf>,
    started: &Config,
    log_filter: super::LogFilter,
) -> Result<Reloading, CliError> {
    let (handle, requests) = eventrelay::reload::channel();
    let generated_token = started
        .auth
        .is_none()
        .then(|| started.publish.token.clone());
    #[cfg(unix)]
    {
        use tokio::signal::unix::{SignalKind, signal};
        let mut hangups = signal(SignalKind::hangup())?;
        actix_web::rt::spawn(async move {
            while hangups.recv().await.is_some() {
                // The relay logs the outcome.
                let _ = handle.reload().await;
            }
        });
    }
    Ok(Reloading {
        load: Box::new(move || {
            let mut config = Config::load(file.as_deref())?;
            if let Some(token) = &generated_token
                && config.development_mode()
                && config.publish.token.is_none()
            {
                config.publish.token.clone_from(token);
            }
            Ok(config)
        }),
        set_log_level: Box::new(move |level| log_filter.set(level)),
        requests,
    })
}

#[derive(Args)]
pub struct ReloadArgs {
    #[command(flatten)]
    pub config: ConfigArgs,
    /// The running relay.
    #[arg(long, default_value = "http://127.0.0.1:8080")]
    pub url: String,
}

/// Asks the relay at `--url` to reload, with the configured admin token,
/// and prints what it applied and what needs a restart.
pub async fn reload(args: ReloadArgs) -> Result<(), CliError> {
    let call = AdminCall::new(&args.config, &args.url).map_err(|error| match error {
        CliError::Usage(_) => CliError::Usage(
            "admin.token is not set: `eventrelay reload` uses the admin API; send SIGHUP to the relay's process instead".into(),
        ),
        other => other,
    })?;
    let body = call.send(reqwest::Method::POST, "/v1/admin/reload").await?;
    println!("{body}");
    Ok(())
}

/// Raises the soft limit on open files to the hard limit. Every SSE
/// connection holds a descriptor, and many runtimes start processes with a
/// soft limit of 1024 under a far higher hard limit, which would cap the
/// relay at about a thousand streams for no reason.
fn raise_file_limit() {
    match rlimit::increase_nofile_limit(u64::MAX) {
        Ok(limit) => tracing::info!(limit, "open file limit"),
        Err(error) => tracing::warn!(%error, "cannot raise the open file limit"),
    }
}

/// Resolves on SIGINT or SIGTERM. The handlers are installed when this is
/// called, so a signal that arrives during start-up is not lost.
fn shutdown_signal() -> std::io::Result<impl std::future::Future<Output = ()>> {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{SignalKind, signal};
        let mut interrupt = signal(SignalKind::interrupt())?;
        let mut terminate = signal(SignalKind::terminate())?;
        Ok(async move {
            tokio::select! {
                _ = interrupt.recv() => {}
                _ = terminate.recv() => {}
            }
        })
    }
    #[cfg(not(unix))]
    Ok(async {
        let _ = tokio::signal::ctrl_c().await;
    })
}
