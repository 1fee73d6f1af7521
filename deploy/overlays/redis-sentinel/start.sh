#!/bin/sh
# Starts one pod's Redis ("redis") or Sentinel ("sentinel"), for the StatefulSet in
# redis.yaml. The master is whichever the Sentinels name; before any Sentinel answers
# (the first start of the set), it is pod 0.
set -eu
role="$1"
headless=authn-gateway-redis-headless
master_name=authn-gateway
me="$(hostname).${headless}"

current_master() {
  for i in 0 1 2; do
    peer="authn-gateway-redis-${i}.${headless}"
    [ "$peer" = "$me" ] && continue
    answer="$(redis-cli -h "$peer" -p 26379 --raw sentinel get-master-addr-by-name "$master_name" 2>/dev/null | head -n 1 || true)"
    if [ -n "$answer" ]; then
      echo "$answer"
      return
    fi
  done
  echo "authn-gateway-redis-0.${headless}"
}

master="$(current_master)"
case "$role" in
  redis)
    # Memory only: the state is a cache and soft coordination, rebuilt in seconds.
    set -- --port 6379 --save "" --appendonly no --maxmemory 256mb \
      --maxmemory-policy allkeys-lru --replica-announce-ip "$me"
    if [ "$master" != "$me" ]; then
      set -- "$@" --replicaof "$master" 6379
    fi
    exec redis-server "$@"
    ;;
  sentinel)
    # Sentinel rewrites its config file, so it lives in a writable emptyDir.
    until redis-cli -h "$master" -p 6379 ping >/dev/null 2>&1; do sleep 1; done
    cat >/sentinel/sentinel.conf <<CONF
port 26379
sentinel resolve-hostnames yes
sentinel announce-hostnames yes
sentinel announce-ip ${me}
sentinel monitor ${master_name} ${master} 6379 2
sentinel down-after-milliseconds ${master_name} 5000
sentinel failover-timeout ${master_name} 30000
sentinel parallel-syncs ${master_name} 1
CONF
    exec redis-server /sentinel/sentinel.conf --sentinel
    ;;
  *)
    echo "usage: start.sh redis|sentinel" >&2
    exit 2
    ;;
esac
