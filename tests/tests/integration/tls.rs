//! TLS on the gRPC links, with a throwaway CA made here: a worker crawls
//! the mock site through a frontier serving TLS, and under mutual TLS; a
//! client that trusts another CA, or shows no certificate where one is
//! asked for, is refused.

use std::path::{Path, PathBuf};

use crawl_tests::{EtcdProcess, FrontierProcess, WorkerProcess, etcd_or_skip, frontier_cli};
use mock_site::{MockSite, SiteConfig, expected_fetches};
use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, Issuer, KeyPair, KeyUsagePurpose};

const MAX_DEPTH: u32 = 40;

/// PEM files of a CA, a server certificate for 127.0.0.1 and a client
/// certificate it signed, and of another CA that signed nothing here.
struct Pki {
    ca: PathBuf,
    server_cert: PathBuf,
    server_key: PathBuf,
    client_cert: PathBuf,
    client_key: PathBuf,
    other_ca: PathBuf,
}

fn new_ca(name: &str) -> (CertificateParams, KeyPair) {
    let key = KeyPair::generate().unwrap();
    let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params.distinguished_name.push(DnType::CommonName, name);
    params.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    (params, key)
}

fn make_pki(dir: &Path) -> Pki {
    let write = |name: &str, pem: String| {
        let path = dir.join(name);
        std::fs::write(&path, pem).unwrap();
        path
    };
    let (ca_params, ca_key) = new_ca("crawl test CA");
    let ca = write("ca.pem", ca_params.self_signed(&ca_key).unwrap().pem());
    let issuer = Issuer::new(ca_params, ca_key);
    let leaf = |names: Vec<String>, common_name: &str| {
        let key = KeyPair::generate().unwrap();
        let mut params = CertificateParams::new(names).unwrap();
        params
            .distinguished_name
            .push(DnType::CommonName, common_name);
        (
            params.signed_by(&key, &issuer).unwrap().pem(),
            key.serialize_pem(),
        )
    };
    let (server_cert, server_key) = leaf(
        vec!["127.0.0.1".to_owned(), "localhost".to_owned()],
        "frontier",
    );
    let (client_cert, client_key) = leaf(vec!["worker".to_owned()], "worker");
    let (other_params, other_key) = new_ca("some other CA");
    Pki {
        ca,
        server_cert: write("server.pem", server_cert),
        server_key: write("server.key", server_key),
        client_cert: write("client.pem", client_cert),
        client_key: write("client.key", client_key),
        other_ca: write(
            "other-ca.pem",
            other_params.self_signed(&other_key).unwrap().pem(),
        ),
    }
}

fn arg(p: &Path) -> &str {
    p.to_str().unwrap()
}

impl Pki {
    /// A client's flags under mutual TLS: the CA and its certificate.
    fn client_flags(&self) -> [&str; 6] {
        self.client_flags_trusting(&self.ca)
    }

    /// This PKI's client certificate, trusting the CA at `ca`.
    fn client_flags_trusting<'a>(&'a self, ca: &'a Path) -> [&'a str; 6] {
        [
            "--tls-ca",
            arg(ca),
            "--tls-cert",
            arg(&self.client_cert),
            "--tls-key",
            arg(&self.client_key),
        ]
    }
}

/// Seeds the site, waits for the crawl to end, and checks every page was
/// fetched as often as the ground truth says (bodies cut at 1 MiB, as
/// the workers are told); `tls` are the CLI's flags.
fn crawl_and_check(site: &MockSite, endpoint: &str, tls: &[&str], workers: Vec<WorkerProcess>) {
    let base = format!("{}/", site.base());
    let mut seed = vec!["seed", base.as_str()];
    seed.extend(tls);
    let (status, text) = frontier_cli(endpoint, &seed);
    assert!(status.success(), "{text}");
    let mut wait = vec!["status", "--wait", "--timeout-secs", "120"];
    wait.extend(tls);
    let (status, text) = frontier_cli(endpoint, &wait);
    assert!(status.success(), "crawl did not finish: {text}");
    for worker in workers {
        let log = worker.log.clone();
        assert!(
            worker.terminate().success(),
            "{}",
            std::fs::read_to_string(log).unwrap_or_default()
        );
    }
    assert_eq!(
        site.page_fetches(),
        expected_fetches(&SiteConfig::default(), MAX_DEPTH),
        "each page fetched as often as the ground truth says"
    );
}

/// The CLI call failed, for the reason `marker` names (the TLS
/// handshake's, not some other).
fn refused(status: std::process::ExitStatus, text: &str, marker: &str) {
    assert!(!status.success(), "let in: {text}");
    assert!(
        text.contains(marker),
        "refused, but not for {marker}: {text}"
    );
}

fn frontier_args<'a>(pki: &'a Pki, depth: &'a str) -> Vec<&'a str> {
    vec![
        "--default-delay-ms",
        "0",
        "--max-depth",
        depth,
        "--tls-cert",
        arg(&pki.server_cert),
        "--tls-key",
        arg(&pki.server_key),
    ]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_crawls_over_tls_and_a_client_trusting_another_ca_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let pki = make_pki(dir.path());
    let site = MockSite::start(SiteConfig::default()).await.unwrap();
    let depth = MAX_DEPTH.to_string();
    let frontier = FrontierProcess::start(&dir.path().join("data"), &frontier_args(&pki, &depth));
    let endpoint = format!("https://{}", frontier.addr);

    let (status, text) = frontier_cli(&endpoint, &["status", "--tls-ca", arg(&pki.other_ca)]);
    refused(status, &text, "UnknownIssuer");
    let (status, text) = frontier_cli(&format!("http://{}", frontier.addr), &["status"]);
    refused(status, &text, "transport error");

    let worker = WorkerProcess::start(
        &endpoint,
        &dir.path().join("out"),
        "w1",
        &[
            "--tls-ca",
            arg(&pki.ca),
            "--retry-base-secs",
            "1",
            "--max-body-bytes",
            "1048576",
        ],
    );
    crawl_and_check(&site, &endpoint, &["--tls-ca", arg(&pki.ca)], vec![worker]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mutual_tls_refuses_a_client_without_a_certificate() {
    let dir = tempfile::tempdir().unwrap();
    let pki = make_pki(dir.path());
    let site = MockSite::start(SiteConfig::default()).await.unwrap();
    let depth = MAX_DEPTH.to_string();
    let mut args = frontier_args(&pki, &depth);
    args.extend(["--tls-client-ca", arg(&pki.ca)]);
    let frontier = FrontierProcess::start(&dir.path().join("data"), &args);
    let endpoint = format!("https://{}", frontier.addr);

    let (status, text) = frontier_cli(&endpoint, &["status", "--tls-ca", arg(&pki.ca)]);
    // The server's alert (CertificateRequired) may or may not arrive
    // before the connection drops: either way, the transport refuses.
    refused(status, &text, "transport error");
    // A certificate of a CA the frontier does not trust is refused too.
    let stranger = dir.path().join("stranger");
    std::fs::create_dir_all(&stranger).unwrap();
    let strangers = make_pki(&stranger);
    let (status, text) = frontier_cli(
        &endpoint,
        &[&["status"][..], &strangers.client_flags_trusting(&pki.ca)].concat(),
    );
    refused(status, &text, "transport error");

    let client_tls = pki.client_flags();
    let mut worker_args = client_tls.to_vec();
    worker_args.extend(["--retry-base-secs", "1", "--max-body-bytes", "1048576"]);
    let worker = WorkerProcess::start(&endpoint, &dir.path().join("out"), "w1", &worker_args);
    crawl_and_check(&site, &endpoint, &client_tls, vec![worker]);
}

#[test]
fn tls_flags_that_cannot_work_are_refused_and_plaintext_beyond_loopback_is_warned_of() {
    let dir = tempfile::tempdir().unwrap();
    let pki = make_pki(dir.path());
    // The key file given as the certificate: named in the error.
    let refused = FrontierProcess::try_start(
        &dir.path().join("data"),
        &[
            "--tls-cert",
            arg(&pki.server_key),
            "--tls-key",
            arg(&pki.server_key),
        ],
    )
    .err()
    .expect("a key given as the certificate is refused");
    assert!(
        refused.contains("--tls-cert") && refused.contains("CERTIFICATE"),
        "{refused}"
    );
    let refused = FrontierProcess::try_start(
        &dir.path().join("data"),
        &["--tls-cert", arg(&pki.server_cert)],
    )
    .err()
    .expect("a certificate without its key is refused");
    assert!(refused.contains("--tls-key"), "{refused}");

    // Plaintext beyond loopback is served, with a warning; on loopback,
    // without one.
    let open = FrontierProcess::start_on(&dir.path().join("open"), "0.0.0.0:0", &[]);
    let warning = "gRPC is served in plaintext on a non-loopback address";
    assert!(open.log_text().contains(warning), "{}", open.log_text());
    let local = FrontierProcess::start(&dir.path().join("local"), &[]);
    assert!(!local.log_text().contains(warning), "{}", local.log_text());
}

/// Two nodes under mutual TLS: each dials the other over TLS with its own
/// certificate (routed writes, partition owners' calls), and a worker
/// given one node finds and uses both.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_links_its_nodes_over_mutual_tls() {
    let Some(binary) = etcd_or_skip("a_cluster_links_its_nodes_over_mutual_tls") else {
        return;
    };
    let etcd = EtcdProcess::start(&binary);
    let dir = tempfile::tempdir().unwrap();
    let pki = make_pki(dir.path());
    let mut sites = Vec::new();
    for i in 1..=2 {
        let listener = tokio::net::TcpListener::bind(format!("127.0.0.{i}:0"))
            .await
            .unwrap();
        sites.push(MockSite::serve(listener, SiteConfig::default()).unwrap());
    }
    let depth = MAX_DEPTH.to_string();
    let nodes: Vec<FrontierProcess> = ["n1", "n2"]
        .iter()
        .map(|id| {
            let mut args = frontier_args(&pki, &depth);
            args.extend([
                "--tls-client-ca",
                arg(&pki.ca),
                "--tls-ca",
                arg(&pki.ca),
                "--etcd",
                &etcd.endpoint,
                "--cluster",
                "tls",
                "--node-id",
                id,
                "--initial-nodes",
                "2",
                "--partitions",
                "8",
                "--lease-ttl-secs",
                "2",
            ]);
            FrontierProcess::start(&dir.path().join(id), &args)
        })
        .collect();
    let client_tls = proto::tls::ClientTls::from_pem(
        Some(&std::fs::read(&pki.ca).unwrap()),
        Some((
            &std::fs::read(&pki.client_cert).unwrap(),
            &std::fs::read(&pki.client_key).unwrap(),
        )),
    );
    let mut admins = Vec::new();
    for node in &nodes {
        let channel = client_tls
            .endpoint(&node.addr.to_string(), true)
            .unwrap()
            .connect()
            .await
            .unwrap();
        let mut admin = proto::admin::admin_client::AdminClient::new(channel);
        crawl_tests::wait_for_cluster(&mut admin, 2).await;
        admins.push(admin);
    }
    let endpoint = format!("https://{}", nodes[0].addr);
    let cli_tls = pki.client_flags();
    let mut worker_args = cli_tls.to_vec();
    worker_args.extend(crawl_tests::CLUSTER_WORKER_ARGS);
    let worker = WorkerProcess::start(&endpoint, &dir.path().join("out"), "w1", &worker_args);
    let mut seed = vec!["seed".to_owned()];
    seed.extend(sites.iter().map(|site| format!("{}/", site.base())));
    seed.extend(cli_tls.iter().map(|a| (*a).to_owned()));
    let seed: Vec<&str> = seed.iter().map(String::as_str).collect();
    let (status, text) = frontier_cli(&endpoint, &seed);
    assert!(status.success(), "{text}");
    let mut wait = vec!["status", "--wait", "--timeout-secs", "180"];
    wait.extend(cli_tls);
    let (status, text) = frontier_cli(&format!("https://{}", nodes[1].addr), &wait);
    assert!(status.success(), "crawl did not finish: {text}");
    assert!(worker.terminate().success());
    let expected = expected_fetches(&SiteConfig::default(), MAX_DEPTH);
    for site in &sites {
        assert_eq!(site.page_fetches(), expected, "{}", site.base());
    }
    // The entry node answers for both: it asked the other over their TLS
    // link (as it routed the writes for the other's partitions).
    let progress = admins[0]
        .get_progress(proto::admin::GetProgressRequest::default())
        .await
        .unwrap()
        .into_inner();
    let names: Vec<&str> = progress.nodes.iter().map(|n| n.node.as_str()).collect();
    assert_eq!(names, ["n1", "n2"], "{progress:?}");
    let held: u64 = progress.nodes.iter().map(|n| n.discovered).sum();
    assert_eq!(held, progress.discovered, "{progress:?}");
    assert!(held >= 2 * expected.len() as u64, "{progress:?}");
}
