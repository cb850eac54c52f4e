# lace build and test entry points. See README.md.
SHELL      := /bin/bash
PYTHON     ?= python3.11
VENV       := .venv
PY         := $(VENV)/bin/python
BUILD      := build
CLANG      ?= clang
APT_PKGS   := clang llvm libbpf-dev bpftool iproute2 tcpdump iperf3 sockperf iputils-ping netcat-openbsd iptables nftables dnsmasq-base etcd-server \
              podman runc mmdebstrap libseccomp-dev pkg-config
BPF_CFLAGS := -O2 -g -target bpf -mcpu=v3 -Wall -Werror -Wno-unused-function \
              -I$(BUILD)/include -Ibpf/include -Ibpf

PROG_SRCS  := $(wildcard bpf/progs/*.c)
TEST_SRCS  := $(wildcard tests/bpf/*.c)
PROG_OBJS  := $(patsubst bpf/progs/%.c,$(BUILD)/bpf/%.o,$(PROG_SRCS))
TEST_OBJS  := $(patsubst tests/bpf/%.c,$(BUILD)/bpf/test/%.o,$(TEST_SRCS))
BPF_HDRS   := $(shell find bpf -name '*.h' -o -name '*.def')
GEN_PY     := lace/datapath/reasons.py
CNI_BIN    := $(VENV)/bin/lace-cni


.PHONY: install system-packages venv bpf progs native gen cni-plugin test test-unit test-schema test-datapath \
        test-integration test-e2e test-kubernetes image lab bench clean upstream

install: .stamp-apt .stamp-venv $(CNI_BIN) bpf native upstream

# Installing a package that ships a service (etcd-server's etcd.service) must not start it: a
# system etcd would listen on 127.0.0.1:2379 in the root namespace, and lace never leaves a listener
# there (its etcd members run only inside lab namespaces). So, unless the machine already has a
# policy-rc.d (a container image's "start nothing"), a temporary one denies every service start
# (exit 101) for the apt-get run and is removed afterwards, even when apt-get fails; then
# etcd.service is disabled (and stopped, should anything have started it) where systemd runs.
system-packages: .stamp-apt
.stamp-apt: Makefile
	@missing=$$(for p in $(APT_PKGS); do dpkg-query -W -f='$${Status}\n' $$p 2>/dev/null | grep -q 'install ok installed' || echo $$p; done); \
	if [ -n "$$missing" ]; then \
	  echo "installing system packages: $$missing"; \
	  policy=/usr/sbin/policy-rc.d; ours=; \
	  if [ ! -e $$policy ]; then \
	    printf '#!/bin/sh\n# lace make install: no service starts during apt-get install\nexit 101\n' > $$policy; \
	    chmod 755 $$policy; ours=1; \
	    trap 'rm -f '$$policy EXIT; \
	  fi; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing >/dev/null; rc=$$?; \
	  if [ -n "$$ours" ]; then rm -f $$policy; fi; \
	  if [ -d /run/systemd/system ] && systemctl list-unit-files etcd.service >/dev/null 2>&1; then \
	    systemctl disable --now etcd.service >/dev/null 2>&1 || true; \
	  fi; \
	  [ $$rc -eq 0 ] || exit $$rc; \
	fi
	@touch $@

venv: .stamp-venv
.stamp-venv: pyproject.toml
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	@$(PY) -m pip install -q --upgrade pip >/dev/null
	@$(PY) -m pip install -q -e '.[test]'
	@$(MAKE) -s cni-plugin
	@touch $@

# The CNI plugin a runtime executes for every pod: started with -S (no site-packages scan) and
# the repo on its path, it imports only the stdlib and lace.cni — a few ms instead of ~90.
cni-plugin: $(CNI_BIN)
$(CNI_BIN): $(wildcard lace/cni/*.py)
	@printf '#!%s -S\nimport sys\nsys.path.insert(0, %s)\nfrom lace.cni.plugin import main\nsys.exit(main())\n' \
	  "$(abspath $(PY))" "'$(CURDIR)'" > $@.tmp && chmod +x $@.tmp && mv $@.tmp $@

$(BUILD)/include/vmlinux.h: | .stamp-apt
	@mkdir -p $(dir $@)
	bpftool btf dump file /sys/kernel/btf/vmlinux format c > $@.tmp && mv $@.tmp $@

# The drop-reason and trace-point tables live once, in bpf/include/lace/abi/*.def;
# the Python enums are generated from them (and checked against the compiled BTF).
gen: $(GEN_PY)
$(GEN_PY): bpf/include/lace/abi/drop_reasons.def bpf/include/lace/abi/trace_points.def tools/gen_enums.py
	$(PYTHON) tools/gen_enums.py

# bench/datapath.py's stage table: pod_veth.c built to return at each of its LACE_BENCH_STAGE cut points
STAGE_OBJS := $(foreach n,1 2 3 4 5 6 7,$(BUILD)/bpf/test/pod_veth_stop$(n).o)

# The agent's one native helper (ctypes): the Maglev table fill, ~100x faster than in CPython.
NATIVE_LIB := $(BUILD)/native/libmaglev.so
native: $(NATIVE_LIB)
$(NATIVE_LIB): native/maglev.c | .stamp-apt
	@mkdir -p $(dir $@)
	$(CLANG) -O2 -Wall -Werror -shared -fPIC -o $@ $<

bpf: $(BUILD)/include/vmlinux.h $(GEN_PY) $(PROG_OBJS) $(TEST_OBJS) $(STAGE_OBJS)

# the datapath's programs only, without the test objects: what the container image ships
progs: $(PROG_OBJS)

$(BUILD)/bpf/%.o: bpf/progs/%.c $(BPF_HDRS) $(BUILD)/include/vmlinux.h
	@mkdir -p $(dir $@)
	$(CLANG) $(BPF_CFLAGS) -c $< -o $@

$(BUILD)/bpf/test/%.o: tests/bpf/%.c $(BPF_HDRS) $(BUILD)/include/vmlinux.h
	@mkdir -p $(dir $@)
	$(CLANG) $(BPF_CFLAGS) -c $< -o $@

$(BUILD)/bpf/test/pod_veth_stop%.o: bpf/progs/pod_veth.c $(BPF_HDRS) $(BUILD)/include/vmlinux.h
	@mkdir -p $(dir $@)
	$(CLANG) $(BPF_CFLAGS) -DLACE_BENCH_STOP=$* -c $< -o $@

PYTEST := $(PY) -m pytest -q -p no:cacheprovider

test: install
	$(PYTEST) tests

test-unit: install
	$(PYTEST) tests/unit
test-schema: install
	$(PYTEST) tests/schema
test-datapath: install
	$(PYTEST) tests/datapath
test-integration: install
	$(PYTEST) tests/integration
test-e2e: install
	$(PYTEST) tests/e2e
test-kubernetes: install
	$(PYTEST) tests/kubernetes

bench: install
	$(PY) bench/datapath.py

# The upstream components of the real-cluster lab (Kubernetes, containerd and runc, etcd, CoreDNS,
# Helm), built from their Go modules at the versions upstream/*/go.mod pin, into build/upstream/
# (one directory per component and version; a second run builds nothing)
upstream: .stamp-apt
	@upstream/build.sh $(BUILD)/upstream

# lace's container image, localhost/lace:<version> (deploy/image/: a Debian base made with
# mmdebstrap, a build stage with the compilers, a final stage without them); podman, no registry
image: .stamp-apt
	@deploy/image/build.sh

# The README's main command: a 3-node lab with real traffic (stays up; `lace lab down` removes it)
lab: install
	$(PY) -m lace.lab.demo

clean:
	rm -rf $(BUILD) .stamp-*
