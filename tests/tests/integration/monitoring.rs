//! The monitoring files in `deploy/`: every metric the Grafana dashboard
//! queries is exported by a running frontier and worker (with the label
//! values it selects on), and the Prometheus scrape configurations point
//! at the ports the compose and Kubernetes stacks serve metrics on.

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;

use crawl_tests::{FrontierProcess, WorkerProcess, frontier_cli, http_get};
use mock_site::{MockSite, SiteConfig};

fn deploy_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../deploy")
}

/// Every `expr` of the dashboard's panels.
fn dashboard_queries() -> Vec<String> {
    let text = std::fs::read_to_string(deploy_dir().join("grafana/crawl-frontier.json")).unwrap();
    let dashboard: serde_json::Value = serde_json::from_str(&text).unwrap();
    let mut queries = Vec::new();
    let mut panels: Vec<&serde_json::Value> =
        dashboard["panels"].as_array().unwrap().iter().collect();
    while let Some(panel) = panels.pop() {
        if let Some(nested) = panel["panels"].as_array() {
            panels.extend(nested);
        }
        for target in panel["targets"].as_array().into_iter().flatten() {
            queries.push(target["expr"].as_str().unwrap().to_owned());
        }
    }
    queries
}

/// Metric names and, per name, the `label="value"` matchers a query
/// selects on.
fn selected(queries: &[String]) -> BTreeMap<String, BTreeSet<String>> {
    let selector =
        regex::Regex::new(r#"\b((?:frontier|worker)_[a-z0-9_]+)(?:\{([^}]*)\})?"#).unwrap();
    let matcher = regex::Regex::new(r#"([a-z_]+)="([^"]*)""#).unwrap();
    let mut names: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for query in queries {
        for found in selector.captures_iter(query) {
            let labels = names.entry(found[1].to_owned()).or_default();
            if let Some(inside) = found.get(2) {
                for pair in matcher.captures_iter(inside.as_str()) {
                    labels.insert(format!("{}=\"{}\"", &pair[1], &pair[2]));
                }
            }
        }
    }
    names
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_metric_the_dashboard_queries_is_exported() {
    let queries = dashboard_queries();
    assert!(queries.len() >= 20, "{queries:?}");
    let wanted = selected(&queries);
    assert!(wanted.keys().any(|name| name.starts_with("frontier_")));
    assert!(wanted.keys().any(|name| name.starts_with("worker_")));

    // A real crawl, so that what is counted per event has happened.
    let site = MockSite::start(SiteConfig::default()).await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let frontier = FrontierProcess::start(
        &dir.path().join("data"),
        &[
            "--metrics-listen",
            "127.0.0.1:0",
            "--default-delay-ms",
            "0",
            "--max-depth",
            "40",
        ],
    );
    let endpoint = frontier.endpoint();
    let (worker, worker_metrics) = WorkerProcess::start_with_metrics(
        &endpoint,
        &dir.path().join("out"),
        "w1",
        &["--retry-base-secs", "1", "--max-body-bytes", "1048576"],
    );
    let (status, text) = frontier_cli(&endpoint, &["seed", &format!("{}/", site.base())]);
    assert!(status.success(), "{text}");
    let (status, text) = frontier_cli(&endpoint, &["status", "--wait", "--timeout-secs", "120"]);
    assert!(status.success(), "crawl did not finish: {text}");
    let exported = format!(
        "{}\n{}",
        http_get(frontier.metrics.as_deref().expect("frontier metrics")).await,
        http_get(&worker_metrics).await
    );
    assert!(worker.terminate().success());

    let samples: Vec<&str> = exported
        .lines()
        .filter(|line| !line.starts_with('#') && !line.trim().is_empty())
        .collect();
    for (name, labels) in &wanted {
        let series: Vec<&&str> = samples
            .iter()
            .filter(|line| {
                line.strip_prefix(name.as_str())
                    .is_some_and(|rest| rest.starts_with('{') || rest.starts_with(' '))
            })
            .collect();
        assert!(!series.is_empty(), "{name} is not exported:\n{exported}");
        for label in labels {
            assert!(
                series.iter().any(|line| line.contains(label.as_str())),
                "no {name} series with {label}: {series:?}"
            );
        }
    }
}

/// The port a `host:port` (or `${VAR:-host:port}`) setting names.
fn port_of(setting: &str) -> u16 {
    setting
        .trim_end_matches('}')
        .rsplit(':')
        .next()
        .and_then(|port| port.parse().ok())
        .unwrap_or_else(|| panic!("no port in {setting:?}"))
}

fn yaml(path: &str) -> Vec<serde_yaml::Value> {
    let text = std::fs::read_to_string(deploy_dir().join(path)).unwrap();
    serde_yaml::Deserializer::from_str(&text)
        .map(|document| serde::Deserialize::deserialize(document).unwrap())
        .collect()
}

#[test]
fn the_scrape_configurations_match_the_ports_the_stacks_serve() {
    // compose: the ports the services are told to serve metrics on are
    // the ports the scrape configuration asks.
    let scrape = &yaml("prometheus/compose.yml")[0]["scrape_configs"];
    let jobs: BTreeMap<&str, &serde_yaml::Value> = scrape
        .as_sequence()
        .unwrap()
        .iter()
        .map(|job| (job["job_name"].as_str().unwrap(), job))
        .collect();
    let frontier_ports: BTreeSet<u16> = jobs["frontier"]["static_configs"]
        .as_sequence()
        .unwrap()
        .iter()
        .flat_map(|config| config["targets"].as_sequence().unwrap())
        .map(|target| port_of(target.as_str().unwrap()))
        .collect();
    let worker_port = jobs["worker"]["dns_sd_configs"][0]["port"]
        .as_u64()
        .unwrap();
    for file in ["compose.yaml", "compose.cluster.yaml"] {
        let text = std::fs::read_to_string(deploy_dir().join(file)).unwrap();
        let setting = |name: &str| -> u16 {
            let line = text
                .lines()
                .find(|line| line.trim_start().starts_with(&format!("{name}:")))
                .unwrap_or_else(|| panic!("{file} sets no {name}"));
            port_of(line.trim())
        };
        assert_eq!(
            frontier_ports,
            BTreeSet::from([setting("FRONTIER_HTTP_LISTEN")]),
            "{file}"
        );
        assert_eq!(
            u64::from(setting("WORKER_METRICS_LISTEN")),
            worker_port,
            "{file}"
        );
    }

    // Kubernetes: each annotated pod serves metrics on the annotated port,
    // as a named container port and as the configmap's listen address.
    let configs: BTreeMap<String, serde_yaml::Value> = yaml("k8s/configmap.yaml")
        .into_iter()
        .map(|map| (map["metadata"]["name"].as_str().unwrap().to_owned(), map))
        .collect();
    for (file, config, variable) in [
        (
            "k8s/frontier.yaml",
            "frontier-config",
            "FRONTIER_HTTP_LISTEN",
        ),
        (
            "k8s/cluster/frontier.yaml",
            "frontier-config",
            "FRONTIER_HTTP_LISTEN",
        ),
        ("k8s/worker.yaml", "worker-config", "WORKER_METRICS_LISTEN"),
    ] {
        let workload = yaml(file)
            .into_iter()
            .find(|doc| matches!(doc["kind"].as_str(), Some("StatefulSet" | "Deployment")))
            .unwrap();
        let template = &workload["spec"]["template"];
        let annotations = &template["metadata"]["annotations"];
        assert_eq!(
            annotations["prometheus.io/scrape"].as_str(),
            Some("true"),
            "{file}"
        );
        let port: u16 = annotations["prometheus.io/port"]
            .as_str()
            .unwrap()
            .parse()
            .unwrap();
        let container_port = template["spec"]["containers"][0]["ports"]
            .as_sequence()
            .unwrap()
            .iter()
            .find(|p| p["name"].as_str() == Some("metrics"))
            .and_then(|p| p["containerPort"].as_u64());
        assert_eq!(container_port, Some(u64::from(port)), "{file}");
        let listen = configs[config]["data"][variable].as_str().unwrap();
        assert_eq!(port_of(listen), port, "{file}: {config} {variable}");
    }
    let kubernetes = &yaml("prometheus/kubernetes.yml")[0];
    assert_eq!(
        kubernetes["scrape_configs"][0]["kubernetes_sd_configs"][0]["role"].as_str(),
        Some("pod")
    );
}
