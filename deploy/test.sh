#!/usr/bin/env bash
# Tests the deployment for real: builds the image (no registry needed),
# starts the compose stack with 3 workers and the mock site, seeds it from
# the host, waits for the crawl to finish, and checks that every page of
# the mock site's ground truth was fetched exactly once. A second run kills
# one worker container mid-crawl and checks that the crawl still completes
# with nothing lost. A third runs the cluster stack (etcd, three frontier
# nodes, workers given one node) and checks the crawl is exact again.
# Skipped, with a message, where no Docker engine runs.
set -euo pipefail

root_dir=$(cd "$(dirname "$0")/.." && pwd)
cd "$root_dir"

if ! command -v docker >/dev/null 2>&1 || ! docker info >/dev/null 2>&1; then
  echo "deploy/test.sh: skipped: no Docker engine available"
  exit 0
fi
if docker compose version >/dev/null 2>&1; then
  compose_cmd=(docker compose)
elif command -v docker-compose >/dev/null 2>&1; then
  compose_cmd=(docker-compose)
else
  echo "deploy/test.sh: skipped: Docker Compose is not installed"
  exit 0
fi

project="crawltest$$"
image="crawl-frontier:test-$$"
max_depth=40
compose() {
  CRAWL_IMAGE="$image" "${compose_cmd[@]}" -p "$project" -f deploy/compose.yaml --profile demo "$@"
}
cleanup() {
  compose down -v --remove-orphans >/dev/null 2>&1 || true
  docker image rm -f "$image" >/dev/null 2>&1 || true
}
trap cleanup EXIT

# Debug binaries: the test suite builds them anyway, so this costs no
# extra compile. Users build release images (deploy/stage-rootfs.sh release).
# Where cargo puts its builds: CARGO_TARGET_DIR when set, as cargo does.
target_dir=${CARGO_TARGET_DIR:-"$root_dir/target"}
staging=$(deploy/stage-rootfs.sh debug "$target_dir/image-test")
docker build -q -f "$staging/Dockerfile" -t "$image" "$staging" >/dev/null
frontier_cli="$target_dir/debug/frontier"
mock_site="$target_dir/debug/mock-site"

export FRONTIER_DEFAULT_DELAY_MS=0 FRONTIER_MAX_DEPTH=$max_depth WORKER_ALLOW_PRIVATE=true \
  WORKER_LEASE_SECS=5 WORKER_RETRY_BASE_SECS=1 WORKER_MAX_BODY_BYTES=1048576 \
  WORKER_CONCURRENCY=4 RUST_LOG=info

expected=$(mktemp)
"$mock_site" --print-expected "$max_depth" | sort > "$expected"

# Fetch counts the mock site logged, as "count path" lines, robots.txt and
# the sitemap left out (every worker reads them).
fetched_counts() {
  compose logs --no-log-prefix mock-site 2>/dev/null | awk '$1 == "HIT" { print $3 }' \
    | grep -v -e '^/robots.txt$' -e '^/sitemap.xml$' | sort | uniq -c | awk '{ print $1 " " $2 }' | sort
}

start_and_seed() {
  compose up -d --scale worker=3 >/dev/null
  local port
  port=$(compose port frontier 7071 | awk -F: '{ print $NF }')
  addr="http://127.0.0.1:$port"
  for _ in $(seq 1 60); do
    "$frontier_cli" probe --addr "$addr" >/dev/null 2>&1 && break
    sleep 1
  done
  "$frontier_cli" seed --addr "$addr" http://mock-site:8080/ >/dev/null
}

wait_done() {
  if ! "$frontier_cli" status --addr "$addr" --wait --timeout-secs 300 >/dev/null; then
    echo "crawl did not finish" >&2
    compose logs --tail 50 >&2
    exit 1
  fi
}

echo "deploy/test.sh: run 1: frontier, 3 workers, mock site"
start_and_seed
wait_done
if ! diff <(fetched_counts) "$expected"; then
  echo "run 1: fetches differ from the ground truth (< fetched, > expected)" >&2
  exit 1
fi
echo "deploy/test.sh: run 1: every page fetched exactly once ($(wc -l < "$expected") pages)"
compose down -v >/dev/null

echo "deploy/test.sh: run 2: one worker container killed mid-crawl"
start_and_seed
for _ in $(seq 1 300); do
  hits=$(compose logs --no-log-prefix mock-site 2>/dev/null | grep -c '^HIT' || true)
  [ "$hits" -ge 30 ] && break
  sleep 0.2
done
# sed, not head: head exits after one line, and under pipefail a compose
# still writing the rest then dies of SIGPIPE (exit 141), failing the run.
victim=$(compose ps -q worker | sed -n 1p)
docker kill "$victim" >/dev/null
wait_done
# Every page at least as often as expected, nothing unexpected, at most one
# extra fetch (the page in flight at the kill: one host, one lease).
python3 - "$expected" <(fetched_counts) <<'PY'
import sys
def read(path):
    counts = {}
    for line in open(path):
        count, page = line.split()
        counts[page] = int(count)
    return counts
expected, fetched = read(sys.argv[1]), read(sys.argv[2])
missing = {p: c for p, c in expected.items() if fetched.get(p, 0) < c}
unexpected = sorted(set(fetched) - set(expected))
surplus = sum(fetched.get(p, 0) - c for p, c in expected.items() if fetched.get(p, 0) > c)
if missing or unexpected or surplus > 1:
    sys.exit(f"run 2: missing {missing}, unexpected {unexpected}, surplus {surplus}")
PY
echo "deploy/test.sh: run 2: crawl completed with nothing lost after a worker was killed"

if ! command -v etcd >/dev/null 2>&1; then
  echo "deploy/test.sh: run 3 skipped: no etcd on this machine to put in the image (apt-get install etcd-server)"
  exit 0
fi
compose down -v >/dev/null
echo "deploy/test.sh: run 3: cluster stack: 3 etcd members, 3 frontier nodes (2 copies), 3 workers, mock site"
cluster_compose() {
  CRAWL_IMAGE="$image" "${compose_cmd[@]}" -p "${project}c" -f deploy/compose.cluster.yaml --profile demo "$@"
}
cluster_cleanup() {
  cluster_compose down -v --remove-orphans >/dev/null 2>&1 || true
  cleanup
}
trap cluster_cleanup EXIT
cluster_compose up -d --scale worker=3 >/dev/null
addrs=()
for node in frontier-1 frontier-2 frontier-3; do
  addrs+=("http://127.0.0.1:$(cluster_compose port "$node" 7071 | awk -F: '{ print $NF }')")
done
for _ in $(seq 1 60); do
  "$frontier_cli" cluster --addr "${addrs[1]}" --json 2>/dev/null | grep '"epoch":1' > /dev/null && break
  sleep 1
done
"$frontier_cli" seed --addr "${addrs[1]}" http://mock-site:8080/ >/dev/null
# One etcd member lost mid-crawl: the other two are a quorum, and nothing
# changes.
cluster_compose kill etcd-1 >/dev/null
if ! "$frontier_cli" status --addr "${addrs[2]}" --wait --timeout-secs 300 >/dev/null; then
  echo "run 3: crawl did not finish" >&2
  cluster_compose logs --tail 50 >&2
  exit 1
fi
cluster_counts() {
  cluster_compose logs --no-log-prefix mock-site 2>/dev/null | awk '$1 == "HIT" { print $3 }' \
    | grep -v -e '^/robots.txt$' -e '^/sitemap.xml$' | sort | uniq -c | awk '{ print $1 " " $2 }' | sort
}
if ! diff <(cluster_counts) "$expected"; then
  echo "run 3: fetches differ from the ground truth (< fetched, > expected)" >&2
  exit 1
fi
"$frontier_cli" cluster --addr "${addrs[0]}"
"$frontier_cli" cluster --addr "${addrs[0]}" --json | python3 -c '
import json, sys
status = json.load(sys.stdin)
short = [p["partition"] for p in status["partition_copies"] if p["copies_in_sync"] != 2]
if status["replicas"] != 2 or short:
    sys.exit(f"run 3: partitions short of two copies: {short}")
'
echo "deploy/test.sh: run 3: cluster stack, one etcd member killed: every page fetched exactly once ($(wc -l < "$expected") pages), every partition on two nodes"
