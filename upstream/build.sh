#!/usr/bin/env bash
# Build the upstream components lace's real-cluster lab runs, from their Go modules at the versions
# pinned in upstream/*/go.mod (each directory is a module of lace's own that requires the upstream
# one; nothing prebuilt is downloaded). Usage: upstream/build.sh OUT [COMPONENT...]
#
# Each binary lands in OUT/<component>-<version>/ and is linked from OUT/bin/; one whose file is
# there already is not built again, so a second run builds nothing, and a version bump in a go.mod
# builds into a new directory. The Go build cache (~/.cache/go-build) makes a rebuild of a changed
# component cheap; a cold build of everything takes tens of minutes on a 2-core machine (the
# Kubernetes binaries most of it: see docs/kubernetes.md).
#
# How each is built follows its project's own release build: Kubernetes with the tags and version
# variables of hack/lib/golang.sh and hack/lib/version.sh (without them its binaries say v0.0.0 and
# version-gated behaviour misfires), runc with seccomp (libseccomp-dev) and its cgo nsenter,
# everything else static (CGO_ENABLED=0).
set -euo pipefail
export GOTOOLCHAIN=local GOFLAGS=-mod=mod

here="$(cd "$(dirname "$0")" && pwd)"
out="${1:?usage: upstream/build.sh OUT [COMPONENT...]}"
shift
mkdir -p "$out/bin"
out="$(cd "$out" && pwd)"

COMPONENTS=(kubernetes containerd etcd coredns helm)
wanted=("$@")
[ ${#wanted[@]} -gt 0 ] || wanted=("${COMPONENTS[@]}")

version_of() {   # version_of DIR MODULE
	(cd "$here/$1" && go list -m -f '{{.Version}}' "$2")
}

# build DIR COMPONENT VERSION BINARY PACKAGE [go build args...]
build() {
	local dir=$1 comp=$2 version=$3 bin=$4 pkg=$5
	shift 5
	local dest="$out/$comp-$version/$bin"
	if [ ! -x "$dest" ]; then
		echo "upstream: building $bin ($comp $version)"
		mkdir -p "$(dirname "$dest")"
		local started=$SECONDS
		(cd "$here/$dir" && go build -trimpath "$@" -o "$dest.tmp" "$pkg")
		# go build -o of a package that is not a main package writes an archive, not a program
		if [ "$(head -c 4 "$dest.tmp")" != $'\x7fELF' ]; then
			echo "upstream/build.sh: $pkg built no program (not a main package?)" >&2
			rm -f "$dest.tmp"
			exit 1
		fi
		mv "$dest.tmp" "$dest"
		echo "upstream: $bin built in $((SECONDS - started)) s"
	fi
	ln -sfn "../$comp-$version/$bin" "$out/bin/$bin"
}

for comp in "${wanted[@]}"; do
	case $comp in
	kubernetes)
		v=$(version_of kubernetes k8s.io/kubernetes)
		minor=${v#v1.}
		minor=${minor%%.*}
		ld="-s -w"
		for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
			ld+=" -X $pkg.gitVersion=$v -X $pkg.gitMajor=1 -X $pkg.gitMinor=$minor"
			ld+=" -X $pkg.gitTreeState=clean -X $pkg.buildDate=1970-01-01T00:00:00Z"
		done
		for bin in kube-apiserver kube-controller-manager kube-scheduler kubelet kubectl kubeadm kube-proxy; do
			CGO_ENABLED=0 build kubernetes kubernetes "$v" "$bin" "k8s.io/kubernetes/cmd/$bin" \
				-tags selinux,notest,grpcnotrace -ldflags "$ld"
		done
		# the test server image's program (deploy/image/upstream.sh makes the image)
		CGO_ENABLED=0 build kubernetes kubernetes "$v" agnhost k8s.io/kubernetes/test/images/agnhost -ldflags "-s -w"
		;;
	containerd)
		v=$(version_of containerd github.com/containerd/containerd/v2)
		ld="-s -w -X github.com/containerd/containerd/v2/version.Version=${v#v}"
		ld+=" -X github.com/containerd/containerd/v2/version.Revision=release"
		for bin in containerd containerd-shim-runc-v2 ctr; do
			CGO_ENABLED=0 build containerd containerd "$v" "$bin" \
				"github.com/containerd/containerd/v2/cmd/$bin" -tags no_btrfs,no_devmapper,no_zfs -ldflags "$ld"
		done
		rv=$(version_of containerd github.com/opencontainers/runc)
		CGO_ENABLED=1 build containerd runc "$rv" runc github.com/opencontainers/runc \
			-tags "seccomp urfave_cli_no_docs" -ldflags "-X main.gitCommit=release"
		;;
	etcd)
		v=$(version_of etcd go.etcd.io/etcd/v3)
		CGO_ENABLED=0 build etcd etcd "$v" etcd go.etcd.io/etcd/server/v3 -ldflags "-s -w"
		CGO_ENABLED=0 build etcd etcd "$v" etcdctl go.etcd.io/etcd/etcdctl/v3 -ldflags "-s -w"
		;;
	coredns)
		v=$(version_of coredns github.com/coredns/coredns)
		CGO_ENABLED=0 build coredns coredns "$v" coredns github.com/coredns/coredns \
			-ldflags "-s -w -X github.com/coredns/coredns/coremain.GitCommit=release"
		;;
	helm)
		v=$(version_of helm helm.sh/helm/v4)
		CGO_ENABLED=0 build helm helm "$v" helm helm.sh/helm/v4/cmd/helm \
			-ldflags "-s -w -X helm.sh/helm/v4/internal/version.version=$v"
		;;
	*)
		echo "upstream/build.sh: no component $comp (components: ${COMPONENTS[*]})" >&2
		exit 2
		;;
	esac
done
