#!/usr/bin/env bash
# The Debian package, installed and run as a user would (docs/packaging.md):
#   1. build it (scripts/package.sh) and check it with lintian;
#   2. a clean Debian 12 root (mmdebstrap, minbase + systemd; the tarball is cached in
#      /var/cache/ferrovs-package, so only the first run downloads), booted with
#      `systemd-nspawn --boot`: the real systemd is PID 1 inside;
#   3. `dpkg -i` the package there: its postinst enables and starts ferrovsd.service, and
#      `systemctl start` returns only once ferrovsd said READY=1 (Type=notify);
#   4. checks: the unit is active with our status line, `ferrovs show` answers with the
#      default configuration, the man pages and completions are installed, the watchdog is
#      armed; `systemctl reload` is a hot upgrade (twice: the new daemon becomes the main
#      process and pings the watchdog itself); a stalled daemon (SIGSTOP) is killed by the
#      watchdog and restarted; installing the package again hot-upgrades the running switch;
#      `systemctl stop` stops it cleanly; `dpkg --purge` removes it.
# Needs root, systemd-nspawn (systemd-container), mmdebstrap, lintian, cargo-deb
# (scripts/deps.sh). Outside CI, missing pieces skip with a message; in CI they fail.
set -euo pipefail
cd "$(dirname "$0")/../.."

t_all=$(date +%s.%N)
since() { awk -v a="$1" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f s", b - a }'; }
fail() { echo "package test: FAIL: $*" >&2; exit 1; }
skip() {
    if [ "${CI:-}" = true ]; then fail "$* (CI=true: required)"; fi
    echo "package test: skipped: $*"
    exit 0
}
[ "$(id -u)" = 0 ] || skip "needs root (systemd-nspawn)"
for tool in systemd-nspawn mmdebstrap lintian nsenter; do
    command -v "$tool" >/dev/null || skip "$tool is not installed (scripts/deps.sh)"
done
[ -x "$HOME/.cargo/bin/cargo-deb" ] || command -v cargo-deb >/dev/null \
    || skip "cargo-deb is not installed (scripts/deps.sh)"

step() { printf -- '--- %s\n' "$*"; }

step "build the package"
t=$(date +%s.%N)
deb=$(bash scripts/package.sh | tail -n 1)
[ -f "$deb" ] || fail "scripts/package.sh made no .deb ($deb)"
echo "$deb ($(du -h "$deb" | cut -f1)), $(since "$t")"

step "lintian"
# initial-upload-closes-no-bugs: an upload to Debian closes its ITP bug; we have none.
lintian --fail-on error,warning --suppress-tags initial-upload-closes-no-bugs "$deb" 2>&1 \
    | grep -v 'running with root privileges' || true
lintian --fail-on error,warning --suppress-tags initial-upload-closes-no-bugs "$deb" \
    >/dev/null 2>&1 || fail "lintian"
echo "lintian clean"

step "a clean Debian 12 root"
cache_dir=/var/cache/ferrovs-package
# The root holds what the package depends on, as `apt install ./ferrovs.deb` would pull it
# in (libpcap for the capture filters' compiler): named in the cache's file name, so a new
# dependency builds a new root.
pkg_deps=$(dpkg-deb -f "$deb" Depends | tr ',' '\n' | sed 's/(.*)//; s/|.*//; s/ //g' \
    | grep -v '^$' | sort -u | paste -sd, -)
cache=$cache_dir/bookworm-systemd-$(printf '%s' "$pkg_deps" | md5sum | cut -c1-8).tar
t=$(date +%s.%N)
if [ ! -s "$cache" ]; then
    mkdir -p "$cache_dir"
    mmdebstrap --quiet --variant=minbase --include="systemd,systemd-sysv,dbus,$pkg_deps" \
        bookworm "$cache_dir/partial.tar" "${DEBIAN_MIRROR:-http://deb.debian.org/debian}"
    mv "$cache_dir/partial.tar" "$cache"
    echo "built and cached $cache"
fi
root=$(mktemp -d /var/tmp/ferrovs-pkgroot.XXXXXX)
log=$root.console.log
nspawn_pid=
cleanup() {
    if [ -n "$nspawn_pid" ] && kill -0 "$nspawn_pid" 2>/dev/null; then
        kill -TERM "$nspawn_pid" 2>/dev/null || true
        for _ in $(seq 50); do kill -0 "$nspawn_pid" 2>/dev/null || break; sleep 0.2; done
        kill -KILL "$nspawn_pid" 2>/dev/null || true
    fi
    rm -rf "$root" "$log"
}
trap cleanup EXIT
tar -C "$root" -xf "$cache"
cp "$deb" "$root/root/ferrovs.deb"
echo "$root from $cache, $(since "$t")"

step "boot it (systemd-nspawn --boot)"
t=$(date +%s.%N)
# --register=no --keep-unit: no systemd (nor machined) on the host to register with.
systemd-nspawn --quiet --directory "$root" --boot --register=no --keep-unit --machine "ferrovs-pkg-$$" \
    --console=passive >"$log" 2>&1 &
nspawn_pid=$!
leader=
for _ in $(seq 100); do
    leader=$(pgrep -P "$nspawn_pid" -x systemd || true)
    [ -n "$leader" ] && break
    sleep 0.1
done
[ -n "$leader" ] || { cat "$log"; fail "no systemd in the container"; }
# Commands run inside: every namespace of the container's PID 1, a plain environment.
inside() { nsenter --target "$leader" --all env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin "$@"; }
state=
for _ in $(seq 300); do
    state=$(inside systemctl is-system-running 2>/dev/null || true)
    case $state in running | degraded) break ;; esac
    sleep 0.2
done
case $state in running | degraded) ;; *) cat "$log"; fail "the container's systemd is '$state'" ;; esac
echo "systemd $(inside systemctl --version | head -n 1 | cut -d' ' -f2) is PID 1 ($state), $(since "$t")"

prop() { inside systemctl show ferrovsd.service -p "$1" --value; }
main_pid() { prop MainPID; }
journal() { inside journalctl -u ferrovsd.service -o cat --no-pager; }
expect() { # expect WHAT COMMAND...: the command succeeds, else the journal and fail
    local what=$1
    shift
    "$@" || { journal | tail -n 40; fail "$what"; }
}

step "dpkg -i (its postinst enables and starts ferrovsd.service)"
t=$(date +%s.%N)
inside dpkg -i /root/ferrovs.deb
expect "ferrovsd.service is not active" inside systemctl is-active --quiet ferrovsd.service
expect "ferrovsd.service is not enabled" inside systemctl is-enabled --quiet ferrovsd.service
echo "installed and started, $(since "$t")"

step "the service"
status=$(prop StatusText)
echo "StatusText: $status"
[ "$status" = "1 bridges, 2 ports (0 connected), 1 PMDs" ] || fail "status line: '$status'"
journal | grep -q 'service manager: ready (1 bridges, 2 ports' || fail "no readiness in the journal"
show=$(inside ferrovs show)
echo "$show" | head -n 8
for want in br0 vm1 vm2; do
    grep -qw "$want" <<<"$show" || fail "ferrovs show has no $want"
done
wd=$(prop WatchdogUSec)
[ "$wd" = 1min ] || fail "WatchdogUSec is '$wd', not 1min"
for f in /usr/share/man/man1/ferrovsd.1.gz /usr/share/man/man1/ferrovs.1.gz \
    /usr/share/man/man1/ferrovs-gen.1.gz /usr/share/bash-completion/completions/ferrovs \
    /usr/share/zsh/vendor-completions/_ferrovs /usr/share/fish/vendor_completions.d/ferrovs.fish \
    /etc/ferrovs/ferrovs.conf.json /etc/default/ferrovsd; do
    inside test -s "$f" || fail "$f is not installed"
done
inside zcat /usr/share/man/man1/ferrovs.1.gz | grep -qF 'add\-port BRIDGE PORT' \
    || fail "the ferrovs man page lacks its commands"
echo "man pages, completions, configuration: installed"

step "systemctl reload = hot upgrade (twice)"
for n in 1 2; do
    t=$(date +%s.%N)
    old=$(main_pid)
    expect "reload $n" inside systemctl reload ferrovsd.service
    new=$(main_pid)
    [ "$new" != "$old" ] && [ "$new" != 0 ] || fail "reload $n: MainPID $old -> $new"
    inside systemctl is-active --quiet ferrovsd.service || fail "reload $n: not active"
    hist=$(inside ferrovs upgrade-history 1)
    grep -q "pid $old -> $new" <<<"$hist" || fail "reload $n: upgrade-history says '$hist'"
    inside ferrovs show >/dev/null || fail "reload $n: ferrovs show"
    echo "reload $n: MainPID $old -> $new ($hist), $(since "$t")"
done
[ "$(prop NRestarts)" = 0 ] || fail "restarted during the reloads"

step "a package upgrade (dpkg -i again) is a hot upgrade, not a restart"
old=$(main_pid)
inside dpkg -i /root/ferrovs.deb >/dev/null
new=$(main_pid)
[ "$new" != "$old" ] && inside systemctl is-active --quiet ferrovsd.service \
    || fail "package upgrade: MainPID $old -> $new, $(prop ActiveState)"
[ "$(prop NRestarts)" = 0 ] && [ "$(inside ferrovs show --json | grep -c '"upgrades": 3')" = 1 ] \
    || fail "package upgrade was not the third hot upgrade: $(inside ferrovs show --json | grep upgrades)"
echo "dpkg -i over the running switch: MainPID $old -> $new by hot upgrade"

step "watchdog (WatchdogSec=2s in a drop-in)"
t=$(date +%s.%N)
inside mkdir -p /etc/systemd/system/ferrovsd.service.d
inside sh -c 'printf "[Service]\nWatchdogSec=2s\nTimeoutAbortSec=2s\n" > /etc/systemd/system/ferrovsd.service.d/test.conf'
inside systemctl daemon-reload
inside systemctl restart ferrovsd.service
pid=$(main_pid)
# Twice: the second new daemon learns the period from the first one, not from systemd.
inside systemctl reload ferrovsd.service
inside systemctl reload ferrovsd.service
pid2=$(main_pid)
sleep 5 # 2.5 periods: a daemon that did not ping would be gone
[ "$(main_pid)" = "$pid2" ] && [ "$(prop NRestarts)" = 0 ] \
    || { journal | tail -n 30; fail "the watchdog fired on a healthy daemon (pid $pid -> $pid2 -> $(main_pid))"; }
echo "pings: pid $pid, then $pid2 after two reloads, alive 5 s on a 2 s watchdog"
inside sh -c "kill -STOP $pid2"
for _ in $(seq 100); do
    [ "$(prop NRestarts)" = 1 ] && inside systemctl is-active --quiet ferrovsd.service && break
    sleep 0.2
done
[ "$(prop NRestarts)" = 1 ] || fail "a stalled daemon was not restarted"
journal | grep -qi 'watchdog timeout' || fail "no watchdog timeout in the journal"
inside ferrovs show >/dev/null || fail "ferrovs show after the watchdog restart"
echo "stalled pid $pid2: watchdog timeout, restarted as pid $(main_pid), $(since "$t")"
inside rm -r /etc/systemd/system/ferrovsd.service.d
inside systemctl daemon-reload

step "stop and purge"
# The daemon's last line and systemd's own lines about the stop reach journald by
# different sockets, in no set order (and systemd may add "Consumed ... CPU time"):
# look for the daemon's "stopped" among the lines the stop added, waiting for
# journald to read them.
before=$(journal | wc -l)
inside systemctl stop ferrovsd.service
[ "$(prop ActiveState)" = inactive ] || fail "not inactive after stop"
clean_stop() { journal | tail -n "+$((before + 1))" | grep -q 'stopped$'; }
for _ in $(seq 50); do clean_stop && break; sleep 0.1; done
clean_stop || { journal | tail -n 20; fail "no clean stop in the journal"; }
inside test ! -e /run/ferrovs/ferrovs.ctl || fail "control socket left behind"
inside dpkg --purge ferrovs >/dev/null
inside test ! -e /usr/bin/ferrovsd || fail "ferrovsd left after purge"
echo "stopped cleanly, purged"

echo "package test: ok ($(since "$t_all") in all)"
