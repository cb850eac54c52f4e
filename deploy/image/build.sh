#!/bin/bash
# Build lace's image, localhost/lace:<version of pyproject.toml> (the name the Helm chart and
# deploy/manifests use), from deploy/image/Containerfile with podman; no registry is contacted.
#
# What podman needs on these machines (Debian 12's podman 4.3, no systemd, root without
# CAP_SYS_RESOURCE, hybrid cgroups: v1 controllers plus cgroup2 at /sys/fs/cgroup/unified):
# --runtime runc: crun, podman's default, refuses hybrid cgroups ("cgroups in hybrid mode not
#   supported, drop all controllers from cgroupv2"); runc runs there.
# --cgroup-manager cgroupfs: no systemd to ask (podman picks it anyway; said here so that it is so).
# --ulimit: podman's default limits (1048576 open files) are above this root's own, and raising a
#   limit needs CAP_SYS_RESOURCE: the build's steps get the machine's limits (processes: at most
#   the 32768 podman lowers its own to before it starts the runtime).
# --network host: the build's RUN steps (apt-get, pip) use the machine's network as it is, so
#   podman sets up no bridge, address or firewall rule for them.
#
# Usage: deploy/image/build.sh [IMAGE]    prints the image's name on stdout
set -euo pipefail

root=$(cd "$(dirname "$0")/../.." && pwd)
version=$(sed -n 's/^version = "\(.*\)"$/\1/p' "$root/pyproject.toml")
image=${1:-localhost/lace:$version}
base=$("$root/deploy/image/base.sh")
# the certificates pip in the build trusts: the machine's own (see the Containerfile)
ca_bundle=${LACE_IMAGE_CA_BUNDLE:-/etc/ssl/certs/ca-certificates.crt}
nproc=$(( $(ulimit -Hu) < 32768 ? $(ulimit -Hu) : 32768 ))

old=$(podman image inspect --format '{{.Id}}' "$image" 2>/dev/null || true)
podman --cgroup-manager cgroupfs --runtime runc build --quiet --layers --jobs 2 --network host \
  --ulimit nofile=$(ulimit -Hn):$(ulimit -Hn) --ulimit nproc=$nproc:$nproc \
  --build-arg BASE="$base" --secret id=ca-bundle,src="$ca_bundle" \
  --ignorefile "$root/deploy/image/Containerfile.ignore" \
  -f "$root/deploy/image/Containerfile" -t "$image" "$root" >/dev/null
# the image this build replaced, now untagged, goes (a rebuild does not leave one behind each time;
# the build's cached layers stay); one a container still uses stays too
new=$(podman image inspect --format '{{.Id}}' "$image")
if [ -n "$old" ] && [ "$old" != "$new" ]; then
  podman rmi "$old" >/dev/null 2>&1 || true
fi
echo "$image"
