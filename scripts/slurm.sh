#!/usr/bin/env bash
# A single-node Slurm for the tests, from Debian's packages: slurmctld and slurmd on this
# host, munge for authentication, and GPUMARKET_SLURM_GPUS GPUs as a GRES. Slurm 22.05 drops
# a GPU GRES without device files, so each "GPU" is a character device that is a copy of
# /dev/null (the tests' jobs never touch a GPU). Installs what is missing, writes the
# configuration, starts what is down, and waits until the node takes jobs. Idempotent.
set -euo pipefail

GPUS=${GPUMARKET_SLURM_GPUS:-4}
as_root() { if [ "$(id -u)" = 0 ]; then "$@"; elif command -v sudo >/dev/null; then sudo "$@"; else "$@"; fi; }

if ! command -v slurmctld >/dev/null || ! command -v slurmd >/dev/null || ! command -v munged >/dev/null \
    || ! command -v sbatch >/dev/null || ! command -v slurmdbd >/dev/null; then
  echo "Slurm is missing; installing Debian's slurmctld, slurmd, slurmdbd, slurm-client and munge"
  as_root apt-get update -qq
  DEBIAN_FRONTEND=noninteractive as_root apt-get install -y -qq --no-install-recommends \
    slurmctld slurmd slurmdbd slurm-client munge >/dev/null
fi

HOST=$(hostname -s)
CPUS=$(nproc)
MEM=$(awk '/MemTotal/ {print int($2 / 1024 / 2)}' /proc/meminfo)
as_root mkdir -p /etc/slurm /var/spool/slurmctld /var/spool/slurmd /var/log/slurm /run/munge
CONF=$(mktemp)
cat >"$CONF" <<CONF
# Written by scripts/slurm.sh: the test suite's single-node cluster.
ClusterName=gpumarket
SlurmctldHost=$HOST
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
StateSaveLocation=/var/spool/slurmctld
SlurmdSpoolDir=/var/spool/slurmd
SlurmctldPidFile=/run/slurmctld.pid
SlurmdPidFile=/run/slurmd.pid
SlurmctldLogFile=/var/log/slurm/slurmctld.log
SlurmdLogFile=/var/log/slurm/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/slurmdbd
AccountingStorageHost=localhost
AccountingStorageTRES=gres/gpu
AccountingStorageEnforce=associations
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
GresTypes=gpu
ReturnToService=2
# Seconds between Slurm's SIGTERM and SIGKILL when a job is cancelled (default 30).
KillWait=2
MpiDefault=none
NodeName=$HOST CPUs=$CPUS RealMemory=$MEM Gres=gpu:$GPUS State=UNKNOWN
PartitionName=gpu Nodes=$HOST Default=YES MaxTime=INFINITE State=UP OverSubscribe=FORCE:8
CONF
DEVICES=/var/spool/slurmd/gpumarket
as_root mkdir -p "$DEVICES"
for i in $(seq 0 $((GPUS - 1))); do
  [ -c "$DEVICES/gpu$i" ] || as_root mknod "$DEVICES/gpu$i" c 1 3
done
GRES=$(mktemp)
echo "NodeName=$HOST Name=gpu Count=$GPUS File=$DEVICES/gpu[0-$((GPUS - 1))]" >"$GRES"
changed=0
if ! cmp -s "$CONF" /etc/slurm/slurm.conf; then as_root cp "$CONF" /etc/slurm/slurm.conf; changed=1; fi
if ! cmp -s "$GRES" /etc/slurm/gres.conf; then as_root cp "$GRES" /etc/slurm/gres.conf; changed=1; fi
rm -f "$CONF" "$GRES"

if [ ! -s /etc/munge/munge.key ]; then
  as_root mungekey --create --force 2>/dev/null || as_root dd if=/dev/urandom of=/etc/munge/munge.key bs=1024 count=1 status=none
fi
as_root chown -R munge:munge /etc/munge /run/munge /var/lib/munge /var/log/munge 2>/dev/null || true
as_root chmod 0400 /etc/munge/munge.key
if ! munge -n >/dev/null 2>&1; then
  as_root runuser -u munge -- /usr/sbin/munged
  for _ in $(seq 1 20); do munge -n >/dev/null 2>&1 && break; sleep 0.25; done
fi
munge -n >/dev/null || { echo "ERROR: munged did not start" >&2; exit 1; }

# Accounting (slurmdbd on this machine's MariaDB): Slurm needs it for reservations that hold
# GPUs (TRES gres/gpu) and for accounts, one per team.
DBD=$(mktemp)
cat >"$DBD" <<CONF
AuthType=auth/munge
DbdHost=localhost
SlurmUser=root
LogFile=/var/log/slurm/slurmdbd.log
PidFile=/run/slurmdbd.pid
StorageType=accounting_storage/mysql
StorageHost=localhost
StorageUser=${GPUMARKET_SLURM_DB_USER:-root}
StorageLoc=gpumarket_slurm_acct
CONF
if ! cmp -s "$DBD" /etc/slurm/slurmdbd.conf; then
  as_root cp "$DBD" /etc/slurm/slurmdbd.conf; changed=1
  as_root pkill -x slurmdbd 2>/dev/null || true
  for _ in $(seq 1 50); do pgrep -x slurmdbd >/dev/null || break; sleep 0.2; done
fi
rm -f "$DBD"
as_root chmod 600 /etc/slurm/slurmdbd.conf
if ! command -v mariadbd >/dev/null && [ ! -x /usr/sbin/mariadbd ]; then
  echo "MariaDB is missing (slurmdbd keeps Slurm's accounts in it); installing Debian's mariadb-server"
  DEBIAN_FRONTEND=noninteractive as_root apt-get install -y -qq --no-install-recommends mariadb-server >/dev/null
fi
if ! mysqladmin -uroot status >/dev/null 2>&1; then
  echo "MariaDB is not answering; starting it"
  as_root start-stop-daemon --start --oknodo --background --exec /usr/sbin/mariadbd
  for _ in $(seq 1 40); do mysqladmin -uroot status >/dev/null 2>&1 && break; sleep 0.5; done
fi
pgrep -x slurmdbd >/dev/null || as_root slurmdbd
for _ in $(seq 1 40); do sacctmgr -n list cluster >/dev/null 2>&1 && break; sleep 0.5; done
sacctmgr -n list cluster format=cluster | grep -qw gpumarket || as_root sacctmgr -i add cluster gpumarket >/dev/null

if [ "$changed" = 1 ]; then
  as_root pkill -x slurmd 2>/dev/null || true
  as_root pkill -x slurmctld 2>/dev/null || true
  for _ in $(seq 1 50); do pgrep -x slurmd >/dev/null || pgrep -x slurmctld >/dev/null || break; sleep 0.2; done
fi
pgrep -x slurmctld >/dev/null || as_root slurmctld
pgrep -x slurmd >/dev/null || as_root slurmd
for _ in $(seq 1 60); do
  state=$(sinfo -h -n "$HOST" -o %t 2>/dev/null || true)
  case "$state" in idle*|mix*|alloc*) break ;; esac
  sleep 0.5
done
state=$(sinfo -h -n "$HOST" -o %t 2>/dev/null || true)
case "$state" in
  idle*|mix*|alloc*) ;;
  down*|drain*) as_root scontrol update NodeName="$HOST" State=RESUME ;;
  *) echo "ERROR: Slurm node $HOST is '$state', not taking jobs (see /var/log/slurm)" >&2; exit 1 ;;
esac
echo "slurm ready: node $HOST, $GPUS GPUs as GRES, $(sinfo --version)"
