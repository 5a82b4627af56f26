//! What managing subscriptions means, whoever asks: the admin API and the
//! command line both create, change and rotate through these rules, so
//! they accept and refuse exactly the same things.

use eventrelay_wire::webhook::WebhookSecret;
use uuid::Uuid;

use super::model::{
    DeliveryOrder, InvalidSubscription, NewSubscription, Subscription, check_max_per_second,
    check_ordering_max_block, validate_subscription, validate_subscription_fields,
};

/// A subscription that comes from the configuration file: it is rewritten
/// from the configuration at every start, so a change made elsewhere would
/// silently disappear.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "subscription {0:?} comes from the configuration (webhooks.subscriptions); edit the configuration instead"
)]
pub struct ConfiguredSubscription(pub String);

/// A fresh `whsec_` secret: 32 bytes from two v4 UUIDs, which come from the
/// operating system's random source.
pub fn generate_secret() -> String {
    let mut bytes = Vec::with_capacity(32);
    bytes.extend_from_slice(Uuid::new_v4().as_bytes());
    bytes.extend_from_slice(Uuid::new_v4().as_bytes());
    WebhookSecret::from_bytes(bytes).to_whsec()
}

/// Refuses a change by hand to a subscription from the configuration.
pub fn ensure_changeable(subscription: &Subscription) -> Result<(), ConfiguredSubscription> {
    if subscription.source == "config" {
        return Err(ConfiguredSubscription(subscription.id.clone()));
    }
    Ok(())
}

/// A subscription to create as the admin API and the command line take it:
/// the secret and the types may be left out.
#[derive(Debug, Default, serde::Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct SubscriptionRequest {
    pub id: String,
    pub url: String,
    pub secret: Option<String>,
    pub types: Option<Vec<String>>,
    pub scope_key: Option<String>,
    pub max_per_second: Option<i32>,
    pub ordering: Option<DeliveryOrder>,
    pub ordering_max_block_secs: Option<i32>,
}

/// Checks a subscription to create, defaulting its types to `*` and
/// generating a secret when none is given. A given secret must be at least
/// [`MIN_SECRET_BYTES`](eventrelay_wire::webhook::MIN_SECRET_BYTES) long;
/// a generated one is 32 bytes.
pub fn prepare_subscription(
    request: SubscriptionRequest,
) -> Result<NewSubscription, InvalidSubscription> {
    let SubscriptionRequest {
        id,
        url,
        secret,
        types,
        scope_key,
        max_per_second,
        ordering,
        ordering_max_block_secs,
    } = request;
    let types = types.unwrap_or_else(|| vec!["*".to_owned()]);
    validate_subscription(Some(&id), Some(&url), Some(&types))?;
    validate_subscription_fields(
        Some(&url),
        Some(&types),
        scope_key.as_deref(),
        secret.as_deref(),
    )?;
    check_max_per_second(max_per_second)?;
    check_ordering_max_block(ordering_max_block_secs)?;
    // A given secret was checked above, its length included.
    let secret = secret.unwrap_or_else(generate_secret);
    Ok(NewSubscription {
        id,
        url,
        secret: secret.into(),
        types,
        scope_key,
        max_per_second,
        ordering: ordering.unwrap_or_default(),
        ordering_max_block_secs,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn generated_secrets_are_32_bytes_in_whsec_form() {
        let secret = generate_secret();
        let encoded = secret.strip_prefix("whsec_").unwrap();
        // 32 bytes are 44 base64 characters, the last one padding.
        assert_eq!((encoded.len(), encoded.ends_with('=')), (44, true));
        WebhookSecret::parse(&secret).unwrap();
        assert_ne!(secret, generate_secret());
    }
}
