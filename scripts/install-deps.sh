#!/usr/bin/env bash
# install-deps.sh installs the Debian packages dlock's tests start servers
# from, if any is missing. It is idempotent and quiet: when everything is
# installed it only checks (dpkg-query) and prints nothing; otherwise it runs
# `apt-get update` once and installs just the missing packages, with sudo
# when not root. Set DLOCK_SKIP_DEPS=1 to skip it (e.g. when the servers are
# given through DLOCK_TEST_*_URL instead).
set -euo pipefail

packages=(
	gcc                  # cgo, which go test -race needs
	libc6-dev            # the C headers cgo compiles against
	redis-server         # redis-server, for redislock and redlock
	etcd-server          # /usr/bin/etcd, for etcdlock
	etcd-client          # etcdctl, for poking at test clusters by hand
	zookeeper            # ZooKeeper's jars, for zklock
	default-jre-headless # the JVM ZooKeeper runs on
	faketime             # libfaketime, for server clock jumps
	postgresql           # initdb and postgres, for pglock
	mariadb-server       # mariadb-install-db and mariadbd, for mysqllock
	python3-kazoo        # Python kazoo's Lock, for zklock's interop tests
	python3-redis        # redis-py's Lock and a Python client of dlock's Redis layout, for interop/
	default-jdk-headless # javac, to compile zklock's Curator peer
	libcurator-recipes-java # Apache Curator 5.4's locks, for zklock's interop tests
	chromium             # headless browser: the checker's HTML timeline test renders in it
)

if [[ "${DLOCK_SKIP_DEPS:-}" == 1 ]]; then
	exit 0
fi
if ! command -v dpkg-query >/dev/null 2>&1 || ! command -v apt-get >/dev/null 2>&1; then
	echo "install-deps: not a Debian-like system; install these yourself (or set DLOCK_TEST_*_URL): ${packages[*]%% *}" >&2
	exit 0
fi

missing=()
for p in "${packages[@]}"; do
	status=$(dpkg-query -W -f='${Status}' "$p" 2>/dev/null || true)
	if [[ "$status" != "install ok installed" ]]; then
		missing+=("$p")
	fi
done
if [[ ${#missing[@]} -eq 0 ]]; then
	exit 0
fi

sudo=()
if [[ $(id -u) -ne 0 ]]; then
	sudo=(sudo)
fi
log=$(mktemp "${TMPDIR:-/tmp}/dlock-install-deps.XXXXXX")
start=$(date +%s)
echo "install-deps: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
if ! { "${sudo[@]}" apt-get update -qq &&
	"${sudo[@]}" apt-get install -y -qq --no-install-recommends -o Dpkg::Use-Pty=0 "${missing[@]}"; } >"$log" 2>&1; then
	echo "install-deps: apt-get failed; its output:" >&2
	tail -n 40 "$log" >&2
	exit 1
fi
rm -f "$log"
echo "install-deps: done in $(($(date +%s) - start))s"
