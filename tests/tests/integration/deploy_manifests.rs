//! deploy/ checked without a cluster: the Kubernetes manifests parse into
//! typed objects whose cross-references hold, every configured variable is
//! a flag the binaries know, and the two Dockerfiles agree on the runtime.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use k8s_openapi::api::apps::v1::{Deployment, StatefulSet};
use k8s_openapi::api::core::v1::{ConfigMap, Container, PodSpec, Service};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

fn deploy_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy")
}

#[derive(Default)]
struct Manifests {
    config_maps: Vec<ConfigMap>,
    services: Vec<Service>,
    stateful_sets: Vec<StatefulSet>,
    deployments: Vec<Deployment>,
}

fn load() -> Manifests {
    load_from(&deploy_dir().join("k8s"))
}

fn load_from(dir: &Path) -> Manifests {
    let mut manifests = Manifests::default();
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "yaml"))
        .collect();
    files.sort();
    assert!(!files.is_empty());
    for file in files {
        let text = std::fs::read_to_string(&file).unwrap();
        for document in serde_yaml::Deserializer::from_str(&text) {
            let value = serde_yaml::Value::deserialize(document).unwrap();
            let kind = value["kind"].as_str().unwrap_or_default().to_owned();
            let where_ = format!("{}: {kind}", file.display());
            match kind.as_str() {
                "ConfigMap" => manifests.config_maps.push(typed(value, &where_)),
                "Service" => manifests.services.push(typed(value, &where_)),
                "StatefulSet" => manifests.stateful_sets.push(typed(value, &where_)),
                "Deployment" => manifests.deployments.push(typed(value, &where_)),
                other => panic!("{}: unexpected kind {other:?}", file.display()),
            }
        }
    }
    manifests
}

use serde::Deserialize;

/// A manifest as its typed object; a field of the wrong type fails.
fn typed<T: serde::de::DeserializeOwned>(value: serde_yaml::Value, where_: &str) -> T {
    serde_yaml::from_value(value).unwrap_or_else(|e| panic!("{where_}: {e}"))
}

fn name_of(meta: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta) -> &str {
    meta.name.as_deref().unwrap_or_default()
}

/// Every workload's pod spec with its name and pod labels.
fn workloads(m: &Manifests) -> Vec<(String, std::collections::BTreeMap<String, String>, PodSpec)> {
    let mut all = Vec::new();
    for set in &m.stateful_sets {
        let spec = set.spec.clone().unwrap();
        let labels = spec.template.metadata.clone().unwrap().labels.unwrap();
        let selector = spec.selector.match_labels.clone().unwrap();
        assert!(
            selector.iter().all(|(k, v)| labels.get(k) == Some(v)),
            "selector of {}",
            name_of(&set.metadata)
        );
        all.push((
            name_of(&set.metadata).to_owned(),
            labels,
            spec.template.spec.unwrap(),
        ));
    }
    for deployment in &m.deployments {
        let spec = deployment.spec.clone().unwrap();
        let labels = spec.template.metadata.clone().unwrap().labels.unwrap();
        let selector = spec.selector.match_labels.clone().unwrap();
        assert!(
            selector.iter().all(|(k, v)| labels.get(k) == Some(v)),
            "selector of {}",
            name_of(&deployment.metadata)
        );
        all.push((
            name_of(&deployment.metadata).to_owned(),
            labels,
            spec.template.spec.unwrap(),
        ));
    }
    all
}

fn port_names_and_numbers(container: &Container) -> (BTreeSet<String>, BTreeSet<i32>) {
    let ports = container.ports.clone().unwrap_or_default();
    (
        ports.iter().filter_map(|p| p.name.clone()).collect(),
        ports.iter().map(|p| p.container_port).collect(),
    )
}

#[test]
fn manifests_parse_and_their_references_hold() {
    let m = load();
    let workloads = workloads(&m);
    let config_maps: BTreeSet<&str> = m.config_maps.iter().map(|c| name_of(&c.metadata)).collect();

    // Every Service selects a workload's pods and targets a port they have.
    for service in &m.services {
        let spec = service.spec.clone().unwrap();
        let selector = spec.selector.unwrap();
        let (_, _, pod) = workloads
            .iter()
            .find(|(_, labels, _)| selector.iter().all(|(k, v)| labels.get(k) == Some(v)))
            .unwrap_or_else(|| panic!("service {} selects no pods", name_of(&service.metadata)));
        for port in spec.ports.unwrap() {
            let matched = pod.containers.iter().any(|c| {
                let (names, numbers) = port_names_and_numbers(c);
                match port
                    .target_port
                    .clone()
                    .unwrap_or(IntOrString::Int(port.port))
                {
                    IntOrString::String(name) => names.contains(&name),
                    IntOrString::Int(number) => numbers.contains(&number),
                }
            });
            assert!(
                matched,
                "service {} targets a port no container has",
                name_of(&service.metadata)
            );
        }
    }

    for (name, _, pod) in &workloads {
        let volumes: BTreeSet<String> = pod
            .volumes
            .clone()
            .unwrap_or_default()
            .into_iter()
            .map(|v| v.name)
            .collect();
        let claims: BTreeSet<String> = m
            .stateful_sets
            .iter()
            .filter(|s| name_of(&s.metadata) == name)
            .flat_map(|s| {
                s.spec
                    .clone()
                    .unwrap()
                    .volume_claim_templates
                    .unwrap_or_default()
            })
            .map(|c| c.metadata.name.unwrap())
            .collect();
        let security = pod.security_context.clone().unwrap();
        assert_eq!(security.run_as_non_root, Some(true), "{name} runs as root");
        assert_eq!(
            security.run_as_user,
            Some(10001),
            "{name}: the image's user"
        );
        for container in &pod.containers {
            let (_, numbers) = port_names_and_numbers(container);
            for probe in [
                &container.readiness_probe,
                &container.liveness_probe,
                &container.startup_probe,
            ]
            .into_iter()
            .flatten()
            {
                let grpc = probe
                    .grpc
                    .clone()
                    .expect("probes use the gRPC health service");
                assert!(
                    numbers.contains(&grpc.port),
                    "{name}: probe port {} is not a container port",
                    grpc.port
                );
            }
            for mount in container.volume_mounts.clone().unwrap_or_default() {
                assert!(
                    volumes.contains(&mount.name) || claims.contains(&mount.name),
                    "{name}: volume {} is not defined",
                    mount.name
                );
            }
            for source in container.env_from.clone().unwrap_or_default() {
                let map = source.config_map_ref.unwrap().name;
                assert!(
                    config_maps.contains(map.as_str()),
                    "{name}: no ConfigMap {map}"
                );
            }
            assert!(
                container.resources.clone().unwrap().requests.is_some(),
                "{name}: no resource requests"
            );
        }
    }

    // The frontier: one replica, a claim for its data, a headless service.
    let frontier = &m.stateful_sets[0];
    let spec = frontier.spec.clone().unwrap();
    assert_eq!(spec.replicas, Some(1), "one server per store");
    let headless = m
        .services
        .iter()
        .find(|s| name_of(&s.metadata) == spec.service_name.as_deref().unwrap())
        .expect("the StatefulSet's service exists");
    assert_eq!(
        headless.spec.clone().unwrap().cluster_ip.as_deref(),
        Some("None")
    );
    let pod = spec.template.spec.unwrap();
    assert!(pod.termination_grace_period_seconds.unwrap() >= 30);
    let mounts = pod.containers[0].volume_mounts.clone().unwrap();
    assert!(mounts.iter().any(|m| m.mount_path == "/data"));

    // Workers reach the frontier through its Service's name and port.
    let worker = m
        .deployments
        .iter()
        .find(|d| name_of(&d.metadata) == "worker")
        .unwrap();
    let worker_pod = worker.spec.clone().unwrap().template.spec.unwrap();
    let args = worker_pod.containers[0].args.clone().unwrap();
    let address = &args[args.iter().position(|a| a == "--frontier").unwrap() + 1];
    let frontier_service = m
        .services
        .iter()
        .find(|s| name_of(&s.metadata) == "frontier")
        .unwrap();
    let port = frontier_service.spec.clone().unwrap().ports.unwrap()[0].port;
    assert_eq!(address, &format!("http://frontier:{port}"));
}

/// The cluster manifests (`deploy/k8s/cluster/`, applied instead of
/// `frontier.yaml`): three nodes whose IDs are their pod names, each
/// advertising its name under the headless Service, all pointed at the
/// etcd Service, the first map waiting for every replica.
#[test]
fn cluster_manifests_parse_and_their_references_hold() {
    let m = load_from(&deploy_dir().join("k8s/cluster"));
    let frontier = m
        .stateful_sets
        .iter()
        .find(|s| name_of(&s.metadata) == "frontier")
        .expect("the frontier StatefulSet");
    let spec = frontier.spec.clone().unwrap();
    let replicas = spec.replicas.unwrap();
    assert!(replicas >= 3, "a cluster of {replicas}");
    let headless_name = spec.service_name.clone().unwrap();
    let headless = m
        .services
        .iter()
        .find(|s| name_of(&s.metadata) == headless_name)
        .expect("the StatefulSet's headless service");
    assert_eq!(
        headless.spec.clone().unwrap().cluster_ip.as_deref(),
        Some("None")
    );
    assert!(
        m.services
            .iter()
            .any(|s| name_of(&s.metadata) == "frontier"),
        "workers' Service kept"
    );
    let pod = spec.template.spec.unwrap();
    assert!(
        pod.containers[0]
            .volume_mounts
            .clone()
            .unwrap()
            .iter()
            .any(|m| m.mount_path == "/data")
    );
    assert!(!spec.volume_claim_templates.unwrap_or_default().is_empty());
    let env: BTreeMap<String, k8s_openapi::api::core::v1::EnvVar> = pod.containers[0]
        .env
        .clone()
        .unwrap()
        .into_iter()
        .map(|var| (var.name.clone(), var))
        .collect();
    let node_id = env["FRONTIER_NODE_ID"].value_from.clone().unwrap();
    assert_eq!(node_id.field_ref.unwrap().field_path, "metadata.name");
    assert_eq!(
        env["FRONTIER_ADVERTISE"].value.as_deref(),
        Some(format!("$(FRONTIER_NODE_ID).{headless_name}:7071").as_str())
    );
    assert_eq!(
        env["FRONTIER_INITIAL_NODES"].value.as_deref(),
        Some(replicas.to_string().as_str())
    );
    let etcd_address = env["FRONTIER_ETCD"].value.clone().unwrap();
    let etcd = m
        .services
        .iter()
        .find(|s| name_of(&s.metadata) == "etcd")
        .expect("the etcd Service");
    let etcd_port = etcd.spec.clone().unwrap().ports.unwrap()[0].port;
    assert_eq!(etcd_address, format!("http://etcd:{etcd_port}"));
    let etcd_set = m
        .stateful_sets
        .iter()
        .find(|s| name_of(&s.metadata) == "etcd")
        .expect("the etcd StatefulSet");
    // Three members: losing one leaves a quorum.
    assert_eq!(etcd_set.spec.clone().unwrap().replicas, Some(3));
    let etcd_pod = etcd_set.spec.clone().unwrap().template.spec.unwrap();
    let (names, numbers) = port_names_and_numbers(&etcd_pod.containers[0]);
    assert!(names.contains("client") && numbers.contains(&etcd_port));
    // Every variable set here is a flag `frontier serve` knows.
    let help = help_of(&["frontier", "serve"]);
    for name in env.keys() {
        assert!(
            help.contains(name.as_str()),
            "{name} is not a flag of frontier serve"
        );
    }
}

fn help_of(args: &[&str]) -> String {
    let output = std::process::Command::new(crawl_tests::binary(args[0]))
        .args(&args[1..])
        .arg("--help")
        .output()
        .unwrap();
    String::from_utf8_lossy(&output.stdout).into_owned()
}

#[test]
fn every_configured_variable_is_a_flag_the_binaries_know() {
    let frontier = help_of(&["frontier", "serve"]);
    let worker = help_of(&["worker"]);
    let known = |variable: &str| {
        variable == "RUST_LOG"
            || frontier.contains(&format!("env: {variable}="))
            || worker.contains(&format!("env: {variable}="))
    };
    for map in load().config_maps {
        for variable in map.data.unwrap().keys() {
            assert!(
                known(variable),
                "ConfigMap {}: {variable} is no flag",
                name_of(&map.metadata)
            );
        }
    }
    let compose = std::fs::read_to_string(deploy_dir().join("compose.yaml")).unwrap();
    let compose: serde_yaml::Value = serde_yaml::from_str(&compose).unwrap();
    for (service, definition) in compose["services"].as_mapping().unwrap() {
        if let Some(environment) = definition["environment"].as_mapping() {
            for variable in environment.keys() {
                let variable = variable.as_str().unwrap();
                assert!(
                    known(variable),
                    "compose {service:?}: {variable} is no flag"
                );
            }
        }
    }
}

#[test]
fn both_dockerfiles_build_the_same_runtime() {
    let runtime = |file: &str| -> Vec<String> {
        let text = std::fs::read_to_string(deploy_dir().join(file)).unwrap();
        // The final stage's runtime settings.
        let last_stage = text.rsplit("\nFROM ").next().unwrap().to_owned();
        last_stage
            .lines()
            .filter(|line| {
                [
                    "USER",
                    "ENV",
                    "VOLUME",
                    "EXPOSE",
                    "HEALTHCHECK",
                    "ENTRYPOINT",
                    "CMD",
                ]
                .iter()
                .any(|k| line.starts_with(k))
            })
            .map(str::to_owned)
            .collect()
    };
    let scratch = runtime("Dockerfile");
    assert!(scratch.len() >= 7, "{scratch:?}");
    assert_eq!(scratch, runtime("Dockerfile.multistage"));
}
