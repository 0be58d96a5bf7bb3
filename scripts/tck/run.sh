#!/usr/bin/env bash
# Runs the official A2A TCK (a2aproject/a2a-tck, pinned below) against:
#   native  - an `a2a-gateway serve` agent whose default capability is tck.conformance
#             (capabilities/conformance.py: the kit's scenarios written with the public API)
#   direct  - the kit's reference agent (sut/a2a-python/sut_agent.py), plaintext on loopback
#   fronted - the same reference agent behind an `a2a-gateway serve` agent ([[upstreams]])
# on each binding (grpc, jsonrpc, http_json): one pytest session per SUT x binding.
# docs/conformance.md says how to read the results and lists the kit's defects.
#
# The kit's checkout and the two virtual environments (the kit's; the reference agent's a2a-sdk)
# are cached OUTSIDE the clone, keyed by the kit commit and the SDK version, in
#   ${A2AGW_TCK_CACHE:-/var/cache/a2agw/tck}   (else ${XDG_CACHE_HOME:-~/.cache}/a2agw/tck)
# so only the first run needs the kit's git source and PyPI. PKI, configs, state and process logs
# live in a temp dir removed at exit (KEEP_WORK=1 keeps it). Only 127.0.0.1 is used. The
# gateway is the clone this script is in, run from its venv (read-only).
#
# Results: $RESULTS_DIR/<sut>-<binding>.{json,xml,log} (per-test JSON from tck_gateway_plugin.py,
# JUnit XML, console), compat/ (the kit's own reports), logs/ (processes, cards), summary.md.
# Exit status: 0, or 1 when CHECK=1 and a native test of level MUST failed.
#
# Environment knobs:
#   SUTS="native direct fronted"   BINDINGS="grpc jsonrpc http_json"
#   GATEWAY_VENV=<clone>/.venv
#   TCK_SOURCE=<git URL or path>    (default: the local mirror if present, else GitHub)
#   A2A_SDK_VERSION                 (reference agent's a2a-sdk; default: the gateway venv's)
#   SUT_REQUEST_HANDLER=legacy|v2   (reference agent's request handler, see the patch)
#   UPSTREAM_BINDING=grpc|jsonrpc   (how the fronting gateway calls the reference agent)
#   TCK_KIT_FIXES=all|none|NAME,... (the plugin's kit fixes; names in tck_gateway_plugin.py)
#   UNFIXED=1                       (also run every SUT x binding with TCK_KIT_FIXES=none)
#   CHECK=1                         (exit 1 on a native MUST failure)
#   RUN_TIMEOUT=600                 (seconds per pytest session)
#   KEEP_WORK=1                     (keep the temp dir: PKI, configs, audit DBs, logs)
#   RESULTS_DIR=$CACHE/results      (wiped and rewritten by every run)
#   WARM_ONLY=1                     (make the cache, print its path, exit: the part that needs
#                                    the kit's git source and PyPI)
#   REQUIRE_CACHE=1                 (exit 77, touching no network, when the cache is not made)
set -euo pipefail

# The kit: branch 1.0-dev at "fix: Add missing A2A-Version header (#177)".
KIT_COMMIT=357c4a87afa2818731590647cccbea31c31733a2
KIT_MIRROR=/work/.mirror/a2aproject+a2a-tck/repo

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO="$(cd "$HERE/../.." && pwd)"
GATEWAY_VENV="${GATEWAY_VENV:-$REPO/.venv}"
GW="$GATEWAY_VENV/bin/a2a-gateway"
if [ -z "${A2AGW_TCK_CACHE:-}" ]; then
  A2AGW_TCK_CACHE=/var/cache/a2agw/tck
  mkdir -p "$A2AGW_TCK_CACHE" 2>/dev/null && [ -w "$A2AGW_TCK_CACHE" ] \
    || A2AGW_TCK_CACHE="${XDG_CACHE_HOME:-$HOME/.cache}/a2agw/tck"
fi
CACHE="$A2AGW_TCK_CACHE"
KIT="$CACHE/kit-$KIT_COMMIT"
TCK_VENV="$CACHE/venv-kit-$KIT_COMMIT"
RESULTS="${RESULTS_DIR:-$CACHE/results}"
if [ -z "${TCK_SOURCE:-}" ]; then
  if [ -d "$KIT_MIRROR" ]; then TCK_SOURCE="$KIT_MIRROR"; else TCK_SOURCE=https://github.com/a2aproject/a2a-tck.git; fi
fi
SUTS="${SUTS:-native direct fronted}"
BINDINGS="${BINDINGS:-grpc jsonrpc http_json}"
SUT_REQUEST_HANDLER="${SUT_REQUEST_HANDLER:-legacy}"
UPSTREAM_BINDING="${UPSTREAM_BINDING:-grpc}"
TCK_KIT_FIXES="${TCK_KIT_FIXES:-all}"
UNFIXED="${UNFIXED:-0}"
CHECK="${CHECK:-0}"
RUN_TIMEOUT="${RUN_TIMEOUT:-600}"
TRUST_DOMAIN="tck.test"
CLIENT_ID="spiffe://$TRUST_DOMAIN/agent/tck"

log() { printf '[tck] %s\n' "$*" >&2; }
die() { log "error: $*"; exit 2; }

# ------------------------------------------------------------------ 1. the kit, the venvs (cached)
# The reference agent's venv is needed only for direct/fronted; its a2a-sdk is the gateway's.
NEEDS_REF=0
case " $SUTS " in *" direct "*|*" fronted "*) NEEDS_REF=1 ;; esac
if [ "$NEEDS_REF" = "1" ] && [ -z "${A2A_SDK_VERSION:-}" ]; then
  [ -x "$GATEWAY_VENV/bin/python" ] || die "no $GATEWAY_VENV (its a2a-sdk version picks the reference agent's)"
  A2A_SDK_VERSION="$("$GATEWAY_VENV/bin/python" -c 'import importlib.metadata as m; print(m.version("a2a-sdk"))')"
fi
SUT_VENV="$CACHE/venv-ref-a2a-sdk-${A2A_SDK_VERSION:-none}"
NEEDED=("$KIT" "$TCK_VENV")
[ "$NEEDS_REF" = "1" ] && NEEDED+=("$SUT_VENV")
if [ "${REQUIRE_CACHE:-0}" = "1" ]; then
  for ready in "${NEEDED[@]}"; do
    [ -f "$ready/.a2agw-ready" ] || { log "not in the cache: $ready (WARM_ONLY=1 $0 makes it)"; exit 77; }
  done
fi
mkdir -p "$CACHE"
if [ ! -f "$KIT/.a2agw-ready" ]; then
  log "checking out the kit $KIT_COMMIT from $TCK_SOURCE into $KIT"
  rm -rf "$KIT"
  git clone -q --no-checkout "$TCK_SOURCE" "$KIT"
  git -C "$KIT" checkout -q --detach "$KIT_COMMIT"
  touch "$KIT/.a2agw-ready"
fi
if [ ! -f "$TCK_VENV/.a2agw-ready" ]; then
  log "making $TCK_VENV"
  rm -rf "$TCK_VENV"
  python3 -m venv "$TCK_VENV"
  "$TCK_VENV/bin/pip" install -q -e "$KIT"
  touch "$TCK_VENV/.a2agw-ready"
fi
if [ "$NEEDS_REF" = "1" ] && [ ! -f "$SUT_VENV/.a2agw-ready" ]; then
  log "making $SUT_VENV"
  rm -rf "$SUT_VENV"
  python3 -m venv "$SUT_VENV"
  "$SUT_VENV/bin/pip" install -q "a2a-sdk[http-server,grpc]==$A2A_SDK_VERSION" uvicorn
  touch "$SUT_VENV/.a2agw-ready"
fi
if [ "${WARM_ONLY:-0}" = "1" ]; then
  echo "$CACHE"
  exit 0
fi
[ -x "$GW" ] || die "no $GW (python3 -m venv .venv && pip install -e . in $REPO)"

# ------------------------------------------------------------------ 2. temp work dir, teardown
WORK="$(mktemp -d "${TMPDIR:-/tmp}/a2agw-tck.XXXXXX")"
PIDS=()
cleanup() {
  local rc=$?
  for pid in "${PIDS[@]:-}"; do
    [ -n "$pid" ] || continue
    kill -TERM -- "-$pid" 2>/dev/null || kill -TERM "$pid" 2>/dev/null || true
  done
  for pid in "${PIDS[@]:-}"; do
    [ -n "$pid" ] || continue
    for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.2; done
    kill -KILL -- "-$pid" 2>/dev/null || true
  done
  if [ -d "$WORK" ]; then
    mkdir -p "$RESULTS/logs"
    cp "$WORK"/*.log "$RESULTS/logs/" 2>/dev/null || true
    if [ "${KEEP_WORK:-0}" = "1" ]; then log "kept $WORK"; else rm -rf "$WORK"; fi
  fi
  exit $rc
}
trap cleanup EXIT INT TERM

rm -rf "$RESULTS"
mkdir -p "$RESULTS/compat" "$RESULTS/logs"

free_port() {
  python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1]); s.close()'
}
start() {  # start NAME CMD...: runs CMD in its own process group, output to $WORK/NAME.log
  local name="$1"; shift
  setsid "$@" > "$WORK/$name.log" 2>&1 < /dev/null &
  PIDS+=("$!")
}
wait_for() {  # wait_for NAME PATTERN: until PATTERN is in NAME's log (60 s)
  local name="$1" pattern="$2"
  for _ in $(seq 300); do
    grep -qE "$pattern" "$WORK/$name.log" 2>/dev/null && return 0
    sleep 0.2
  done
  tail -20 "$WORK/$name.log" >&2
  die "$name did not print /$pattern/"
}
svid_dns_name() {
  "$GATEWAY_VENV/bin/python" -c 'import sys; from policies.identity import svid_dns_name; print(svid_dns_name(sys.argv[1]))' "$1"
}

# ------------------------------------------------------------------ 3. PKI (development CA)
"$GW" pki init --dir "$WORK/pki" --trust-domain "$TRUST_DOMAIN" > /dev/null
"$GW" pki issue native --dir "$WORK/pki" --loopback-sans > /dev/null   # https://127.0.0.1 needs IP:127.0.0.1
"$GW" pki issue front --dir "$WORK/pki" --loopback-sans > /dev/null
"$GW" pki issue tck --dir "$WORK/pki" > /dev/null                      # the TCK's client SVID
"$GW" pki issue webhook --dir "$WORK/pki" --loopback-sans > /dev/null  # the kit's https webhook

# ------------------------------------------------------------------ 4. configs
policy() {  # policy FILE CAPABILITY...
  local file="$1"; shift
  local caps; caps="$(printf '"%s", ' "$@")"
  cat > "$file" <<POLICY
version = 1

[[grants]]
peer = "$CLIENT_ID"
capabilities = [${caps%, }]
max_payload_bytes = 1048576
expires_at = "2099-01-01T00:00:00Z"
push_hosts = ["127.0.0.1", "example.com"]  # the kit's CRUD tests name https://example.com (never delivered to: their tasks are terminal)
POLICY
}
agent_config() {  # agent_config NAME MODULE
  cat > "$WORK/$1.toml" <<CONFIG
id = "spiffe://$TRUST_DOMAIN/agent/$1"
listen = "127.0.0.1:0"
policy = "$1-policy.toml"
audit_db = "state/$1-audit.sqlite"
state_dir = "state/$1"
modules = [$2]

[tls]
ca = "pki/ca.pem"
cert = "pki/$1.pem"
key = "pki/$1.key"

[a2a]
http_listen = "127.0.0.1:0"
default_capability = "tck.conformance"

[push]
enabled = true
ca = "pki/ca.pem"             # the kit's webhook receiver: https with a certificate of the dev CA
CONFIG
}

REF_HTTP_PORT="$(free_port)"
REF_GRPC_PORT="$(free_port)"
while [ "$REF_GRPC_PORT" = "$REF_HTTP_PORT" ]; do REF_GRPC_PORT="$(free_port)"; done

agent_config native '"capabilities.conformance"'
policy "$WORK/native-policy.toml" tck.conformance

agent_config front ''
policy "$WORK/front-policy.toml" tck.conformance
if [ "$UPSTREAM_BINDING" = "grpc" ]; then
  upstream_where="address = \"127.0.0.1:$REF_GRPC_PORT\""
else
  upstream_where="url = \"http://127.0.0.1:$REF_HTTP_PORT/\""
fi
cat >> "$WORK/front.toml" <<CONFIG

[[upstreams]]                 # the reference agent, plaintext on loopback (no id)
binding = "$UPSTREAM_BINDING"
$upstream_where
streaming = true

[[upstreams.skills]]
skill = "tck"                 # the reference agent's one skill id
capability = "tck.conformance"
version = "1.0.0"
risk = "read"
timeout = 15.0
description = "The A2A TCK reference agent (sut/a2a-python/sut_agent.py), fronted"
# Every part kind both ways, Message answers, and questions (input-required) passed through:
# the reference agent's scenarios need them, and the upstream decides what it accepts.
accepts = { data = true, text = true, files = ["*/*"], urls = true, max_parts = 16 }
gives = { data = true, text = true, files = ["*/*"], urls = true, messages = true }
CONFIG

# ------------------------------------------------------------------ 5. the reference agent
case " $SUTS " in *" direct "*|*" fronted "*)
  mkdir -p "$WORK/ref"
  cp "$KIT/sut/a2a-python/sut_agent.py" "$WORK/ref/sut_agent.py"
  patch -s "$WORK/ref/sut_agent.py" "$HERE/sut_agent-a2a-sdk-1.x.patch" \
    || die "sut_agent-a2a-sdk-1.x.patch no longer applies to the kit's sut_agent.py"
  start ref env SUT_HOST="127.0.0.1:$REF_HTTP_PORT" GRPC_PORT="$REF_GRPC_PORT" SUT_BIND=127.0.0.1 \
    SUT_REQUEST_HANDLER="$SUT_REQUEST_HANDLER" "$SUT_VENV/bin/python" "$WORK/ref/sut_agent.py"
  for _ in $(seq 150); do
    curl -fsS "http://127.0.0.1:$REF_HTTP_PORT/.well-known/agent-card.json" > "$RESULTS/logs/ref-card.json" 2>/dev/null && break
    sleep 0.2
  done
  [ -s "$RESULTS/logs/ref-card.json" ] || { tail -20 "$WORK/ref.log" >&2; die "the reference agent did not serve its card"; }
  ;;
esac

# ------------------------------------------------------------------ 6. gateway agents
declare -A SUT_URL SUT_AGENT
start_gateway() {  # start_gateway SUT NAME: serve NAME.toml, then SUT_URL[SUT] = its https URL
  "$GW" config check --config "$WORK/$2.toml" > "$WORK/$2-check.log" 2>&1 \
    || { cat "$WORK/$2-check.log" >&2; die "config check of $2 failed"; }
  start "$2" "$GW" serve --config "$WORK/$2.toml"
  wait_for "$2" "a2a https on https://"
  SUT_URL[$1]="$(grep -oE 'a2a https on https://[0-9.:]+' "$WORK/$2.log" | head -1 | sed 's/^a2a https on //')"
  SUT_AGENT[$1]="spiffe://$TRUST_DOMAIN/agent/$2"
  curl -fsS --cacert "$WORK/pki/ca.pem" -H 'A2A-Version: 1.0' \
    "${SUT_URL[$1]}/.well-known/agent-card.json" > "$RESULTS/logs/$2-card.json" || true
}
case " $SUTS " in *" native "*) start_gateway native native ;; esac
case " $SUTS " in *" fronted "*) start_gateway fronted front ;; esac
SUT_URL[direct]="http://127.0.0.1:$REF_HTTP_PORT"

# ------------------------------------------------------------------ 7. the TCK runs
run_one() {  # run_one SUT BINDING OUTDIR KIT_FIXES
  local sut="$1" binding="$2" out="$3" fixes="$4" name="$1-$2"
  local -a env=(PYTHONPATH="$HERE" A2AGW_TCK_RESULTS_JSON="$out/$name.json" A2AGW_TCK_KIT_FIXES="$fixes"
                A2AGW_TCK_WEBHOOK_CERT="$WORK/pki/webhook.pem" A2AGW_TCK_WEBHOOK_KEY="$WORK/pki/webhook.key")
  if [ "$sut" != "direct" ]; then
    env+=(A2AGW_TCK_CA="$WORK/pki/ca.pem" A2AGW_TCK_CERT="$WORK/pki/tck.pem" A2AGW_TCK_KEY="$WORK/pki/tck.key"
          A2AGW_TCK_GRPC_TARGET_NAME="$(svid_dns_name "${SUT_AGENT[$sut]}")")
  fi
  # The kit's own run_tck.py arguments (tests/compatibility/, --sut-host, --transport,
  # --tb=short, reports), plus the plugin and per-run report paths.
  (cd "$KIT" && env "${env[@]}" timeout -k 10 "$RUN_TIMEOUT" "$TCK_VENV/bin/python" -m pytest \
      -p tck_gateway_plugin -p no:cacheprovider tests/compatibility/ \
      "--sut-host=${SUT_URL[$sut]}" "--transport=$binding" --webhook-host=127.0.0.1 --tb=short -q \
      "--compatibility-report=$out/compat/$name" "--junitxml=$out/$name.xml" \
      -o junit_suite_name="$name" > "$out/$name.log" 2>&1) || true
  log "$name: $(tail -1 "$out/$name.log")"
}
for sut in $SUTS; do
  for binding in $BINDINGS; do
    run_one "$sut" "$binding" "$RESULTS" "$TCK_KIT_FIXES"
  done
done
if [ "$UNFIXED" = "1" ]; then
  mkdir -p "$RESULTS/unfixed/compat"
  for sut in $SUTS; do
    for binding in $BINDINGS; do
      run_one "$sut" "$binding" "$RESULTS/unfixed" none
    done
  done
fi

# ------------------------------------------------------------------ 8. summary
{
  echo "# A2A TCK results"
  echo
  echo "- kit: a2aproject/a2a-tck @ $KIT_COMMIT; kit fixes: $TCK_KIT_FIXES"
  echo "- gateway: $(git -C "$REPO" rev-parse --short HEAD 2>/dev/null || echo '?')$( [ -n "$(git -C "$REPO" status --porcelain --untracked-files=no 2>/dev/null)" ] && echo ' (dirty work tree)')"
  echo "- reference agent: sut/a2a-python/sut_agent.py + sut_agent-a2a-sdk-1.x.patch, a2a-sdk ${A2A_SDK_VERSION:-(not run)}, handler $SUT_REQUEST_HANDLER"
  echo "- fronted: upstream binding $UPSTREAM_BINDING"
  echo "- date: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
} > "$WORK/header.md"
"$TCK_VENV/bin/python" "$HERE/summarize.py" "$RESULTS" "$WORK/header.md" > /dev/null
log "summary: $RESULTS/summary.md"
if [ "$CHECK" = "1" ]; then
  "$TCK_VENV/bin/python" "$HERE/summarize.py" --check "$RESULTS"
fi
