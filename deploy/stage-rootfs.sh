#!/usr/bin/env bash
# Stages the image's root file system from binaries cargo builds on this
# machine, so that `docker build` needs no base image (no registry is
# needed): the frontier, worker and mock-site binaries (and etcd, when
# this machine has it), exactly the shared
# libraries they load (read off ldd), a non-root user, and the data and
# output directories.
#
#   deploy/stage-rootfs.sh [debug|release] [STAGING_DIR]
#
# Prints the staging directory; build with
#   docker build -f deploy/Dockerfile -t crawl-frontier:local STAGING_DIR
set -euo pipefail

profile=${1:-release}
root_dir=$(cd "$(dirname "$0")/.." && pwd)
# Where cargo puts its builds: CARGO_TARGET_DIR when set, as cargo does.
target_dir=${CARGO_TARGET_DIR:-"$root_dir/target"}
staging=${2:-"$target_dir/image-rootfs"}

case "$profile" in
  release) cargo_flags=(--release); target_sub=release ;;
  debug) cargo_flags=(); target_sub=debug ;;
  *) echo "profile must be debug or release, not $profile" >&2; exit 2 ;;
esac

binaries=(frontier worker mock-site)
(cd "$root_dir" && cargo build --locked "${cargo_flags[@]}" -p frontier -p worker -p mock-site --bins >&2)

rm -rf "$staging"
mkdir -p "$staging/rootfs/usr/local/bin" "$staging/rootfs/etc" "$staging/rootfs/data" \
  "$staging/rootfs/warc" "$staging/rootfs/tmp"
cp "$root_dir/deploy/Dockerfile" "$staging/Dockerfile"
for binary in "${binaries[@]}"; do
  cp "$target_dir/$target_sub/$binary" "$staging/rootfs/usr/local/bin/$binary"
  # Every library the binary loads, at the path it is loaded from, and the
  # file a symlink points to.
  for lib in $(ldd "$target_dir/$target_sub/$binary" | grep -oE '/[^ ]+'); do
    mkdir -p "$staging/rootfs$(dirname "$lib")"
    cp -L "$lib" "$staging/rootfs$lib"
  done
done
# etcd for the cluster stack (deploy/compose.cluster.yaml): Debian's
# etcd-server binary, when this machine has it.
if etcd_path=$(command -v etcd); then
  cp "$etcd_path" "$staging/rootfs/usr/local/bin/etcd"
  for lib in $(ldd "$etcd_path" | grep -oE '/[^ ]+' || true); do
    mkdir -p "$staging/rootfs$(dirname "$lib")"
    cp -L "$lib" "$staging/rootfs$lib"
  done
else
  echo "stage-rootfs: no etcd on this machine; the image cannot run the cluster stack" >&2
fi
cat > "$staging/rootfs/etc/passwd" <<'PASSWD'
root:x:0:0:root:/root:/sbin/nologin
crawler:x:10001:10001:crawler:/data:/sbin/nologin
PASSWD
cat > "$staging/rootfs/etc/group" <<'GROUP'
root:x:0:
crawler:x:10001:
GROUP
# glibc's resolver: files first, then DNS (container names resolve by DNS).
echo 'hosts: files dns' > "$staging/rootfs/etc/nsswitch.conf"
chmod 1777 "$staging/rootfs/tmp"
echo "$staging"
