#!/bin/sh
# The remote shell of ctest mpi.hosts (real_hosts.sh), given to Open MPI's rsh launcher as
# `--mca plm_rsh_agent`. Called as ssh would be, `netns_rsh.sh <host> <command words...>`, it
# runs the command -- its words joined by spaces and run by sh, as ssh does -- in the network
# namespace named <host>, inside a UTS namespace of its own whose host name is <host>: every
# process of that "host" (Open MPI's orted and the ranks it starts) sees that name and only
# that namespace's network.
set -eu
if [ $# -lt 2 ]; then
  echo "usage: netns_rsh.sh <host> <command...>" >&2
  exit 255
fi
host=$1
shift
case $host in
  dcpn[0-9]*h[0-9]*) ;;
  *)
    echo "netns_rsh.sh: '$host' is not a host of mpi.hosts (dcpn<pid>h<i>)" >&2
    exit 255
    ;;
esac
# A host with memory of its own (real_hosts.sh --tier): the mount namespace of the process
# holding it, where its private tmpfs is mounted, is entered first.
if [ -f "/run/dcp-mnt/$host.pid" ]; then
  exec nsenter --mount="/proc/$(cat "/run/dcp-mnt/$host.pid")/ns/mnt" ip netns exec "$host" \
    unshare --uts sh -c 'hostname "$1" && exec sh -c "$2"' sh "$host" "$*"
fi
exec ip netns exec "$host" unshare --uts sh -c 'hostname "$1" && exec sh -c "$2"' sh "$host" "$*"
