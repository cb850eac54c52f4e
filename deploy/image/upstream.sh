#!/bin/bash
# The container images the real-cluster lab's nodes run beside lace's own, built here from their
# sources (no registry): written as image archives into OUT (default build/images/) that
# `lace lab up --kubernetes` imports into every node's containerd.
#
#   registry.k8s.io/pause:<tag>                  the sandbox image: build/pause/linux/pause.c of the
#                                                Kubernetes module, static (its Makefile's flags)
#   registry.k8s.io/e2e-test-images/agnhost:<v>  agnhost (make upstream builds it from
#                                                test/images/agnhost), on lace's Debian base (a shell
#                                                for the tests that exec one)
#   registry.k8s.io/coredns/coredns:<v>          CoreDNS (make upstream), alone in the image
#   localhost/lace:<version>                     make image's image
#
# An archive already there for the same tag (lace's: the same image ID) is not made again.
# Usage: deploy/image/upstream.sh [OUT]    prints one "IMAGE ARCHIVE" line per image
set -euo pipefail

root=$(cd "$(dirname "$0")/../.." && pwd)
out=${1:-$root/build/images}
bin=${LACE_UPSTREAM_BIN:-$root/build/upstream/bin}
mkdir -p "$out"
podman=(podman --cgroup-manager cgroupfs --runtime runc)

kdir=$(cd "$root/upstream/kubernetes" && GOFLAGS=-mod=mod go list -m -f '{{.Dir}}' k8s.io/kubernetes)
pause_tag=$(sed -n 's/^TAG ?= *//p' "$kdir/build/pause/Makefile")
agnhost_tag=$(cat "$kdir/test/images/agnhost/VERSION")
coredns_tag=$(basename "$(dirname "$(readlink -f "$bin/coredns")")")
coredns_tag=${coredns_tag#coredns-}
lace_version=$(sed -n 's/^version = "\(.*\)"$/\1/p' "$root/pyproject.toml")

# image IMAGE ARCHIVE CONTEXT: build CONTEXT/Containerfile as IMAGE and save it to ARCHIVE
image() {
	local name=$1 archive=$2 ctx=$3
	if [ ! -s "$archive" ]; then
		"${podman[@]}" build --quiet --network none -t "$name" "$ctx" >/dev/null
		"${podman[@]}" save --quiet --format docker-archive -o "$archive.tmp" "$name"
		mv "$archive.tmp" "$archive"
	fi
	echo "$name $archive"
}

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

mkdir "$work/pause"
gcc -Os -Wall -Werror -static -DVERSION="v$pause_tag-lace" -o "$work/pause/pause" "$kdir/build/pause/linux/pause.c"
cat >"$work/pause/Containerfile" <<'EOF'
FROM scratch
COPY pause /pause
USER 65535:65535
ENTRYPOINT ["/pause"]
EOF
image "registry.k8s.io/pause:$pause_tag" "$out/pause-$pause_tag.tar" "$work/pause"

mkdir "$work/coredns"
cp "$(readlink -f "$bin/coredns")" "$work/coredns/coredns"
cat >"$work/coredns/Containerfile" <<'EOF'
FROM scratch
COPY coredns /coredns
EXPOSE 53 53/udp
ENTRYPOINT ["/coredns"]
EOF
image "registry.k8s.io/coredns/coredns:$coredns_tag" "$out/coredns-$coredns_tag.tar" "$work/coredns"

mkdir "$work/agnhost"
cp "$(readlink -f "$bin/agnhost")" "$work/agnhost/agnhost"
base=$("$root/deploy/image/base.sh")
cat >"$work/agnhost/Containerfile" <<EOF
FROM $base
COPY agnhost /agnhost
ENTRYPOINT ["/agnhost"]
CMD ["pause"]
EOF
image "registry.k8s.io/e2e-test-images/agnhost:$agnhost_tag" "$out/agnhost-$agnhost_tag.tar" "$work/agnhost"

# lace's own: make image builds it; its archive is keyed by the image's ID
lace_image=localhost/lace:$lace_version
id=$("${podman[@]}" image inspect --format '{{.Id}}' "$lace_image" 2>/dev/null) || {
	echo "deploy/image/upstream.sh: $lace_image is not built: run make image" >&2
	exit 1
}
archive=$out/lace-$lace_version-${id:0:12}.tar
if [ ! -s "$archive" ]; then
	find "$out" -maxdepth 1 -name "lace-$lace_version-*.tar" -delete
	"${podman[@]}" save --quiet --format docker-archive -o "$archive.tmp" "$lace_image"
	mv "$archive.tmp" "$archive"
fi
echo "$lace_image $archive"
