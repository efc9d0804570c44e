# shellcheck shell=bash
# shellcheck disable=SC2034 # the SOFTROCE_* results are read by the files that source this one
# Soft-RoCE topologies: one host (rxe0 on a veth pair) or N emulated hosts on a bridge.
# Sourced by ci/softroce/guest.sh (inside the VM) and by ci/softroce.sh (native mode).
# Needs root, bash, iproute2 (ip, rdma, tc) and the modules veth, rdma_rxe, bridge, sch_*.
#
# Every host lives in the root network namespace: rxe on Linux 6.1 keeps its UDP socket in
# the initial namespace, so an rxe device on a veth inside another namespace sends nothing.
# Addresses come from 198.18.0.0/24 (RFC 2544 benchmark range): they exist only on the
# veths made here, so no RDMA packet can leave the machine.
#
# Inside the VM every fork+exec costs ~40 ms (TCG), so this file batches ip/tc/rdma
# commands (-batch) and reads sysfs with the shell's `read` builtin.
#
# Results, for the caller to export: SOFTROCE_DEVICE SOFTROCE_ADDR SOFTROCE_GID_INDEX
# (host 0), SOFTROCE_HOSTS ("dev,addr dev,addr ..."), SOFTROCE_DESCRIPTION (one line).

SOFTROCE_NET_PREFIX=198.18.0
declare -gA SOFTROCE_SYSCTL_SAVED=() # path -> value before we changed it (native restore); -g: sourced from a function
SOFTROCE_NET_LINKS=()                 # netdevs we created, for softroce_net_down
SOFTROCE_NET_RXE=()                   # rxe devices we created
SOFTROCE_NET_TCP_RULES=0              # hosts whose TCP rules softroce_net_tcp_over_links added
SOFTROCE_NET_LOCAL_MOVED=0            # it moved the local table's rule from pref 0 to 100

# Write one sysctl, remembering its old value so native mode can put the host back.
softroce_sysctl_set() {
  local path=/proc/sys/$1 value=$2 old
  if [[ -z ${SOFTROCE_SYSCTL_SAVED[$path]+set} ]] && read -r old <"$path"; then
    SOFTROCE_SYSCTL_SAVED[$path]=$old
  fi
  echo "$value" >"$path"
}

softroce_sysctl_restore() {
  local path
  for path in "${!SOFTROCE_SYSCTL_SAVED[@]}"; do
    echo "${SOFTROCE_SYSCTL_SAVED[$path]}" >"$path" 2>/dev/null || true
  done
  SOFTROCE_SYSCTL_SAVED=()
}

# The RoCE v2 GID of an IPv4 address as sysfs prints it (::ffff:a.b.c.d).
softroce_gid_of_ipv4() {
  local -a octet
  IFS=. read -r -a octet <<<"$1"
  printf -v REPLY '0000:0000:0000:0000:0000:ffff:%02x%02x:%02x%02x' \
    "${octet[0]}" "${octet[1]}" "${octet[2]}" "${octet[3]}"
}

# Sets REPLY to the GID index of DEV whose GID is ADDR's RoCE v2 GID. Index 1 is usual
# (0 is the fe80:: link-local one), but ib_core fills the table from a workqueue after
# `rdma link add`, so poll for a bounded time. Only the first 16 of rxe's 1024 slots are
# read: scanning all of them with cat took 90 s under TCG (notes, pitfall 3).
softroce_find_gid_index() {
  local dev=$1 addr=$2 want gid type i attempt
  local dir=/sys/class/infiniband/$dev/ports/1
  softroce_gid_of_ipv4 "$addr"
  want=$REPLY
  if [[ ! -d $dir ]]; then
    echo "softroce: no rdma device $dev" >&2
    return 1
  fi
  for ((attempt = 0; attempt < 100; attempt++)); do
    for ((i = 0; i < 16; i++)); do
      read -r gid 2>/dev/null <"$dir/gids/$i" || continue
      [[ $gid == "$want" ]] || continue
      read -r type 2>/dev/null <"$dir/gid_attrs/types/$i" || type=
      if [[ $type == "RoCE v2" ]]; then
        REPLY=$i
        return 0
      fi
    done
    sleep 0.05
  done
  echo "softroce: no RoCE v2 GID $want on $dev after 100 polls" >&2
  return 1
}

# Make room for our names: delete netdevs an earlier run left behind (an rxe device goes
# with its netdev), but never an rxe device someone made on another netdev.
softroce_net_clear_names() {
  local -a netdevs=() rxes=()
  local name attempt
  for name in "$@"; do
    case $name in
      rxe*) rxes+=("$name") ;;
      *) netdevs+=("$name") ;;
    esac
  done
  for name in "${netdevs[@]}"; do
    [[ ! -e /sys/class/net/$name ]] || ip link delete "$name" || return 1
  done
  for name in "${rxes[@]}"; do
    # rxe unregisters from a workqueue after its netdev goes.
    for ((attempt = 0; attempt < 40 && ${#netdevs[@]}; attempt++)); do
      [[ -e /sys/class/infiniband/$name ]] || break
      sleep 0.05
    done
    if [[ -e /sys/class/infiniband/$name ]]; then
      echo "softroce: $name already exists on another netdev; not touching it" >&2
      return 1
    fi
  done
}

# One host: rxe0 on veth0 (198.18.0.1); veth1 (198.18.0.2) only keeps the link up. Both
# processes of a test use rxe0: rxe sees its own MAC as destination and loops the packets
# back inside the device. Not lo: rdma_cm can't resolve a route over it (pitfall 6).
softroce_net_up_single() {
  local addr=$SOFTROCE_NET_PREFIX.1
  softroce_net_clear_names veth0 rxe0 || return 1
  # lo: connections to a local address (perftest's TCP handshake) go through it, and a
  # fresh VM has it down.
  ip -batch - <<EOF || return 1
link set lo up
link add veth0 type veth peer name veth1
addr add $addr/24 dev veth0
addr add $SOFTROCE_NET_PREFIX.2/24 dev veth1
link set veth0 up
link set veth1 up
EOF
  SOFTROCE_NET_LINKS+=(veth0)
  rdma link add rxe0 type rxe netdev veth0 || return 1
  SOFTROCE_NET_RXE+=(rxe0)
  softroce_find_gid_index rxe0 "$addr" || return 1
  SOFTROCE_DEVICE=rxe0
  SOFTROCE_ADDR=$addr
  SOFTROCE_GID_INDEX=$REPLY
  SOFTROCE_HOSTS="rxe0,$addr"
  SOFTROCE_DESCRIPTION="rxe0 on veth0 $addr gid $REPLY"
}

# N hosts: host i is veth h$i (198.18.0.1$i, device rxe$i) whose peer h$i-p is a port of
# bridge br0, so traffic between hosts really crosses veth -> bridge -> veth and a qdisc on
# h$i / h$i-p shapes that host's link.
softroce_net_up_hosts() {
  local n=$1 i name mask dev addr batch_ip='' batch_rdma='' hosts='' gids=''
  local -a names=(br0)
  for ((i = 0; i < n; i++)); do names+=("h$i" "rxe$i"); done
  softroce_net_clear_names "${names[@]}" || return 1

  # All hosts share one namespace, so by default every veth answers ARP for every local
  # address and the kernel drops packets whose source is local: connection setup then took
  # 27 s or failed. Set default before the links exist so they inherit it; all/ for the
  # settings where the kernel takes the max of all/ and the interface.
  local conf key
  for conf in all default; do
    for key in accept_local=1 rp_filter=0 arp_ignore=1 arp_announce=2; do
      softroce_sysctl_set "net/ipv4/conf/$conf/${key%=*}" "${key#*=}"
    done
  done
  # Every host's packets cross veth -> bridge -> veth through one CPU's input backlog, 1,000
  # packets by default: a 280 kB RDMA READ answered while four others run overflowed it
  # (/proc/net/softnet_stat drops, rxe send_err ~1,000 per run). The READ is then retried,
  # and Linux 6.1's rxe completer, meeting a retried READ's responses out of order, moves the
  # QP to the error state without an error completion (WARNING at rxe_comp.c:756): only
  # flushes, a connection lost for nothing (ShardRun.AReplicaThatReads..., ~1 run in 8). A
  # NIC ring and switch buffers absorb such bursts on a real network.
  softroce_sysctl_set net/core/netdev_max_backlog 100000

  batch_ip+=$'link set lo up\nlink add br0 type bridge\nlink set br0 up\n'
  for ((i = 0; i < n; i++)); do
    addr=$SOFTROCE_NET_PREFIX.1$i
    batch_ip+="link add h$i type veth peer name h$i-p"$'\n'
    batch_ip+="link set h$i-p master br0"$'\n'
    batch_ip+="addr add $addr/24 dev h$i"$'\n'
    batch_ip+="link set h$i-p up"$'\n'"link set h$i up"$'\n'
    batch_rdma+="link add rxe$i type rxe netdev h$i"$'\n'
  done
  ip -batch - <<<"$batch_ip" || return 1
  SOFTROCE_NET_LINKS+=(br0)
  for ((i = 0; i < n; i++)); do SOFTROCE_NET_LINKS+=("h$i"); done

  for ((i = 0; i < n; i++)); do
    for name in "h$i" "h$i-p"; do
      for key in accept_local=1 rp_filter=0 arp_ignore=1 arp_announce=2; do
        echo "${key#*=}" >"/proc/sys/net/ipv4/conf/$name/${key%=*}"
      done
      # One CPU per link: spread over 2 vCPUs, packets of one QP overtake each other, rxe
      # retransmits and the throughput to a shaped host randomly halves.
      printf -v mask '%x' $((1 << (i % 2)))
      echo "$mask" >"/sys/class/net/$name/queues/rx-0/rps_cpus"
    done
  done

  # Permanent neighbour entries between the hosts: the first rdma_resolve_addr across the
  # bridge otherwise waits on ARP, which on a CPU-starved TCG VM took longer than a 5–20 s
  # connect timeout (seen as "no answer … while resolving" in the first cross-host test).
  local j neigh=''
  for ((i = 0; i < n; i++)); do
    for ((j = 0; j < n; j++)); do
      ((i == j)) && continue
      neigh+="neigh replace $SOFTROCE_NET_PREFIX.1$j lladdr $(<"/sys/class/net/h$j/address") dev h$i nud permanent"$'\n'
    done
  done
  ip -batch - <<<"$neigh" || return 1

  # rdma parses "-batch" as "-b atch": spell it -b.
  rdma -b - <<<"$batch_rdma" || return 1
  for ((i = 0; i < n; i++)); do SOFTROCE_NET_RXE+=("rxe$i"); done

  for ((i = 0; i < n; i++)); do
    dev=rxe$i addr=$SOFTROCE_NET_PREFIX.1$i
    softroce_find_gid_index "$dev" "$addr" || return 1
    hosts+="${hosts:+ }$dev,$addr"
    gids+="${gids:+,}$REPLY"
    if ((i == 0)); then
      SOFTROCE_GID_INDEX=$REPLY
    elif [[ $REPLY != "$SOFTROCE_GID_INDEX" ]]; then
      echo "softroce: warning: $dev has its GID at index $REPLY, rxe0 at $SOFTROCE_GID_INDEX" >&2
    fi
  done
  SOFTROCE_DEVICE=rxe0
  SOFTROCE_ADDR=$SOFTROCE_NET_PREFIX.10
  SOFTROCE_HOSTS=$hosts
  SOFTROCE_DESCRIPTION="$n hosts rxe0..rxe$((n - 1)) on br0 $SOFTROCE_NET_PREFIX.10-1$((n - 1)) gid $gids"
}

# TCP between two hosts' addresses over their links, not loopback: in one namespace every
# host address is local, so the local table (rule 0) sends such a packet through lo. Rules for
# TCP sent from here (iif lo) from host i to host j route it out of h<i> instead, and the
# local table moves behind them; an arriving packet (iif h<j>) still finds its address local
# (accept_local, rp_filter 0: set above). UDP, and so rxe, is untouched. Which host a packet
# leaves is known from its source — a socket bound to its host's address — or, for a socket that
# connects unbound (gloo's, torch's store clients), from its owner: a process of uid
# SOFTROCE_HOST_UID_BASE + i is host i's (its source is then chosen as host i's address).
SOFTROCE_HOST_UID_BASE=10000
softroce_host_uids() { echo "$((SOFTROCE_HOST_UID_BASE + $1))-$((SOFTROCE_HOST_UID_BASE + $1))"; }  # ip's uidrange
softroce_net_tcp_over_links() {
  local n=$1 i j batch=''
  for ((i = 0; i < n; i++)); do
    for ((j = 0; j < n; j++)); do
      ((i == j)) && continue
      batch+="route replace $SOFTROCE_NET_PREFIX.1$j dev h$i src $SOFTROCE_NET_PREFIX.1$i table $((100 + i))"$'\n'
      batch+="rule add pref 10 iif lo ipproto tcp from $SOFTROCE_NET_PREFIX.1$i to $SOFTROCE_NET_PREFIX.1$j"
      batch+=" lookup $((100 + i))"$'\n'
      batch+="rule add pref 11 iif lo ipproto tcp uidrange $(softroce_host_uids "$i")"
      batch+=" to $SOFTROCE_NET_PREFIX.1$j lookup $((100 + i))"$'\n'
    done
  done
  # The local table's rule moves from 0 to 100 (a host without it at 0 keeps what it has).
  if ip rule show pref 0 | grep -q 'lookup local'; then
    batch+=$'rule add pref 100 lookup local\nrule del pref 0 lookup local\n'
    SOFTROCE_NET_LOCAL_MOVED=1
  fi
  SOFTROCE_NET_TCP_RULES=$n  # before the batch: a half-applied one is undone too
  ip -batch - <<<"$batch" || return 1
  SOFTROCE_DESCRIPTION+=", TCP over the links"
}

# Shape host I's link: "I:RATE" in both directions (its veth h<I> carries what it sends, the
# bridge port h<I>-p what it receives), "I:RATE:in" only what it receives. tbf: netem rate
# does the same, htb+fq_codel was worse. The rate seen by one flow is RATE x 0.946.
softroce_net_shape() {
  local -a specs=("$@")
  local spec i rate batch=''
  ((${#specs[@]})) || return 0
  for spec in "${specs[@]}"; do
    i=${spec%%:*} rate=${spec#*:}
    if [[ $rate == *:in ]]; then
      rate=${rate%:in}
      SOFTROCE_DESCRIPTION+=", into h$i at $rate"
    elif [[ $rate == *:out ]]; then
      rate=${rate%:out}
      batch+="qdisc replace dev h$i root tbf rate $rate burst 32kb latency 400ms"$'\n'
      SOFTROCE_DESCRIPTION+=", out of h$i at $rate"
      continue
    else
      batch+="qdisc replace dev h$i root tbf rate $rate burst 32kb latency 400ms"$'\n'
      SOFTROCE_DESCRIPTION+=", h$i at $rate"
    fi
    batch+="qdisc replace dev h$i-p root tbf rate $rate burst 32kb latency 400ms"$'\n'
  done
  tc -batch - <<<"$batch" || return 1
}

# Undo softroce_net_up_* (native mode: the host's own kernel keeps what we made).
softroce_net_down() {
  local name i j
  if ((SOFTROCE_NET_LOCAL_MOVED)); then  # the local table first again
    ip rule add pref 0 lookup local 2>/dev/null || true
    ip rule del pref 100 lookup local 2>/dev/null || true
    SOFTROCE_NET_LOCAL_MOVED=0
  fi
  if ((SOFTROCE_NET_TCP_RULES > 0)); then
    for ((i = 0; i < SOFTROCE_NET_TCP_RULES; i++)); do
      for ((j = 0; j < SOFTROCE_NET_TCP_RULES; j++)); do
        ((i == j)) && continue
        ip rule del pref 10 iif lo ipproto tcp from "$SOFTROCE_NET_PREFIX.1$i" to "$SOFTROCE_NET_PREFIX.1$j" \
          2>/dev/null || true
        ip rule del pref 11 iif lo ipproto tcp uidrange "$(softroce_host_uids "$i")" \
          to "$SOFTROCE_NET_PREFIX.1$j" 2>/dev/null || true
      done
    done
    SOFTROCE_NET_TCP_RULES=0
  fi
  for name in "${SOFTROCE_NET_RXE[@]}"; do rdma link delete "$name" 2>/dev/null || true; done
  for name in "${SOFTROCE_NET_LINKS[@]}"; do ip link delete "$name" 2>/dev/null || true; done
  SOFTROCE_NET_RXE=() SOFTROCE_NET_LINKS=()
  softroce_sysctl_restore
}
