//! The load tool's one reader of a relay's `/metrics` (the Prometheus text
//! format): every scenario that reads a counter, a gauge or a histogram
//! goes through [`Metrics`], so the format is parsed in one place.

/// One sample line: `name{label="value",…} value`.
#[derive(Debug, Clone, PartialEq)]
pub struct Sample {
    pub name: String,
    pub labels: Vec<(String, String)>,
    pub value: f64,
}

impl Sample {
    /// A sample line; `None` for comments, blank lines and what does not
    /// parse.
    pub fn parse(line: &str) -> Option<Sample> {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            return None;
        }
        let (series, value) = line.rsplit_once(' ')?;
        let value = match value {
            "+Inf" => f64::INFINITY,
            value => value.parse().ok()?,
        };
        let (name, labels) = match series.split_once('{') {
            None => (series, Vec::new()),
            Some((name, rest)) => (name, labels(rest.strip_suffix('}')?)?),
        };
        Some(Sample {
            name: name.to_owned(),
            labels,
            value,
        })
    }

    /// The value of label `name`.
    pub fn label(&self, name: &str) -> Option<&str> {
        self.labels
            .iter()
            .find(|(label, _)| label == name)
            .map(|(_, value)| value.as_str())
    }
}

/// `a="x",b="y"` as pairs (values hold no quotes in the relay's metrics).
fn labels(text: &str) -> Option<Vec<(String, String)>> {
    text.split(',')
        .filter(|pair| !pair.is_empty())
        .map(|pair| {
            let (name, value) = pair.split_once('=')?;
            let value = value.strip_prefix('"')?.strip_suffix('"')?;
            Some((name.trim().to_owned(), value.to_owned()))
        })
        .collect()
}

/// Everything one read of `/metrics` served.
#[derive(Debug, Clone, Default)]
pub struct Metrics {
    pub samples: Vec<Sample>,
}

impl Metrics {
    pub fn parse(text: &str) -> Metrics {
        Metrics {
            samples: text.lines().filter_map(Sample::parse).collect(),
        }
    }

    /// The first sample that `query` names, 0 when none does. A query is a
    /// series as the text shows it, `replays_total{source="memory"}`: its
    /// name may leave out the relay's prefix (`eventrelay_`), and its
    /// labels must be among the sample's.
    pub fn value(&self, query: &str) -> f64 {
        let Some(wanted) = Sample::parse(&format!("{query} 0")) else {
            return 0.0;
        };
        self.samples
            .iter()
            .find(|sample| {
                (sample.name == wanted.name || sample.name.ends_with(&format!("_{}", wanted.name)))
                    && wanted
                        .labels
                        .iter()
                        .all(|(name, value)| sample.label(name) == Some(value))
            })
            .map_or(0.0, |sample| sample.value)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_query_finds_its_series_by_name_and_labels() {
        let metrics = Metrics::parse(
            "# HELP eventrelay_replays_total Replays.\n\
             eventrelay_replays_total{source=\"memory\"} 3\n\
             eventrelay_replays_total{source=\"outbox\"} 4\n\
             eventrelay_sse_connections 12\n\
             eventrelay_stage_bucket{le=\"+Inf\",stage=\"commit\"} 20\n",
        );
        assert_eq!(metrics.value("replays_total{source=\"outbox\"}"), 4.0);
        assert_eq!(metrics.value("sse_connections"), 12.0);
        assert_eq!(metrics.value("connections"), 12.0);
        assert_eq!(metrics.value("missing"), 0.0);
        assert_eq!(metrics.samples[3].label("le"), Some("+Inf"));
    }
}
