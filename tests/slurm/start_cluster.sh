#!/usr/bin/env bash
# start_cluster.sh (plexgpu test copy of ../shared/slurm) - start a REAL single-node SLURM cluster on Debian 12 (bookworm)
# as root, without systemd as PID 1 (container/VM sandbox), with:
#   * slurmctld + slurmd (22.05.x from Debian), munge auth; ProctrackType=proctrack/pgid: a job's processes
#     that were re-parented to init (a double fork) still carry its process group and die with scancel;
#     proctrack/linuxproc follows parent links only and lets them live on (measured: tests/slurm/README.md)
#   * 1 node = $(hostname -s), fake CPUs/memory, 4 fake GPUs (gres/gpu, /dev/null-like char devices)
#   * partitions hpg-turin (default, "cpu") and hpg-b200 ("gpu")
#   * slurmdbd + MariaDB accounting (WITH_DBD=1, default): accounts clive (GrpTRES gres/gpu=3)
#     and maigan (GrpTRES gres/gpu=2), enforced (associations,limits)
#   * optional Python venv with snakemake + snakemake-executor-plugin-slurm (WITH_VENV=1, default)
# Idempotent: re-running only (re)starts what is not running or whose config changed.
# Stop everything with stop_cluster.sh.
set -euo pipefail

LAB=${SLURMLAB_DIR:-${TMPDIR:-/tmp}/slurm-test-cluster}
WITH_DBD=${WITH_DBD:-1}          # 0 = no slurmdbd/mariadb (sacct then does NOT work)
WITH_VENV=${WITH_VENV:-0}        # 1 = create $VENV with snakemake + slurm executor plugin (plexgpu brings its own)
VENV=${SLURMLAB_VENV:-$LAB/venv}
SNAKEMAKE_SPEC=${SNAKEMAKE_SPEC:-snakemake==9.27.1}
PLUGIN_SPEC=${PLUGIN_SPEC:-snakemake-executor-plugin-slurm==2.8.0}
CLUSTER=${SLURM_CLUSTER_NAME:-lab}
NODE=$(hostname -s)
NCPUS=${SLURM_FAKE_CPUS:-8}      # may exceed real cores (SlurmdParameters=config_overrides)
MEM_MB=${SLURM_FAKE_MEM_MB:-16000}
NGPUS=${SLURM_FAKE_GPUS:-6}      # more GPUs than the accounts may hold: the account limits bind
DBPASS=${SLURM_DB_PASS:-slurmdbpass}
ACCT_USERS=${SLURM_ACCT_USERS:-$(id -un)}   # users to associate with both accounts

T0=$(date +%s%N)
log() { local ms=$(( ($(date +%s%N) - T0) / 1000000 )); printf '[%4d.%03ds] %s\n' $((ms/1000)) $((ms%1000)) "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }
wait_for() { # wait_for <seconds> <description> <command...>
  local t=$1 what=$2; shift 2
  for _ in $(seq 1 $((t * 4))); do "$@" >/dev/null 2>&1 && return 0; sleep 0.25; done
  die "timeout after ${t}s waiting for: $what"
}
pid_alive() { [ -s "$1" ] && kill -0 "$(cat "$1")" 2>/dev/null; }
stop_pidfile() { # stop_pidfile <pidfile> : SIGTERM the pid in it and wait
  local f=$1 p
  pid_alive "$f" || return 0
  p=$(cat "$f"); kill "$p" 2>/dev/null || true
  for _ in $(seq 1 80); do kill -0 "$p" 2>/dev/null || return 0; sleep 0.25; done
  die "pid $p from $f did not exit"
}
# install_file <dest> <mode>  (content on stdin) ; returns 0 if the file changed
install_file() {
  local dest=$1 mode=$2 tmp; tmp=$(mktemp)
  cat >"$tmp"
  if [ -f "$dest" ] && cmp -s "$tmp" "$dest"; then rm -f "$tmp"; return 1; fi
  install -m "$mode" "$tmp" "$dest"; rm -f "$tmp"; return 0
}

[ "$(id -u)" = 0 ] || die "must run as root"
mkdir -p "$LAB"

# ---------------------------------------------------------------- 1. packages
PKGS="munge slurmctld slurmd slurm-client"
[ "$WITH_DBD" = 1 ] && PKGS="$PKGS slurmdbd mariadb-server"
missing=""
for p in $PKGS; do dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing="$missing $p"; done
if [ -n "$missing" ]; then
  log "apt-get install:$missing"
  # never let package postinst scripts start daemons (no systemd here; we start them ourselves)
  made_policy=0
  if [ ! -e /usr/sbin/policy-rc.d ]; then printf '#!/bin/sh\nexit 101\n' >/usr/sbin/policy-rc.d; chmod +x /usr/sbin/policy-rc.d; made_policy=1; fi
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $missing >"$LAB/apt-install.log" 2>&1 \
    || { tail -20 "$LAB/apt-install.log"; die "apt-get install failed"; }
  [ "$made_policy" = 1 ] && rm -f /usr/sbin/policy-rc.d
  log "packages installed"
else
  log "packages already installed"
fi
log "versions: $(slurmctld -V) / $(munged -V 2>&1 | head -1)"

# ---------------------------------------------------------------- 2. host name
getent hosts "$NODE" >/dev/null || { echo "127.0.0.1 $NODE" >>/etc/hosts; log "added $NODE to /etc/hosts"; }

# ---------------------------------------------------------------- 3. munge
if [ ! -s /etc/munge/munge.key ]; then
  mkdir -p /etc/munge
  dd if=/dev/urandom of=/etc/munge/munge.key bs=1 count=1024 status=none
fi
chown -R munge:munge /etc/munge; chmod 700 /etc/munge; chmod 400 /etc/munge/munge.key
install -d -o munge -g munge -m 0755 /run/munge
install -d -o munge -g munge -m 0700 /var/log/munge /var/lib/munge
if pid_alive /run/munge/munged.pid && munge -n 2>/dev/null | unmunge >/dev/null 2>&1; then
  log "munged already running"
else
  runuser -u munge -- /usr/sbin/munged --force
  wait_for 10 "munge" sh -c 'munge -n | unmunge'
  log "munged started"
fi

# ---------------------------------------------------------------- 4. fake GPU device files
# gres/gpu needs File= entries that are character devices (regular files are rejected
# with "is not a valid character or block device"; Count= without File= makes the node
# register gpu:0 and go INVAL). Char devices with major/minor 1,3 behave like /dev/null.
install -d "$LAB/fakegpu"
for i in $(seq 0 $((NGPUS - 1))); do
  [ -c "$LAB/fakegpu/nvidia$i" ] || { rm -f "$LAB/fakegpu/nvidia$i"; mknod -m 666 "$LAB/fakegpu/nvidia$i" c 1 3; }
done

# ---------------------------------------------------------------- 5. config files
install -d /etc/slurm /var/lib/slurm/slurmctld /var/lib/slurm/slurmd /var/log/slurm
if [ "$WITH_DBD" = 1 ]; then
  ACCT_CONF="AccountingStorageType=accounting_storage/slurmdbd
AccountingStorageHost=localhost
AccountingStoragePort=6819
AccountingStorageTRES=gres/gpu
AccountingStorageEnforce=associations,limits
AccountingStoreFlags=job_comment"
else
  # AccountingStorageTRES=gres/gpu is fatal without slurmdbd
  ACCT_CONF="AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/filetxt
JobCompLoc=/var/log/slurm/jobcomp.log"
fi
conf_changed=0
install_file /etc/slurm/slurm.conf 0644 <<EOF && conf_changed=1 || true
# generated by $LAB/start_cluster.sh
ClusterName=$CLUSTER
SlurmctldHost=$NODE
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
StateSaveLocation=/var/lib/slurm/slurmctld
SlurmdSpoolDir=/var/lib/slurm/slurmd
SlurmctldPidFile=/run/slurmctld.pid
SlurmdPidFile=/run/slurmd.pid
SlurmctldLogFile=/var/log/slurm/slurmctld.log
SlurmdLogFile=/var/log/slurm/slurmd.log
SlurmctldPort=6817
SlurmdPort=6818
MailProg=/bin/true
MpiDefault=none
SwitchType=switch/none
ProctrackType=proctrack/pgid
TaskPlugin=task/none
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
DefMemPerCPU=1000
GresTypes=gpu
SlurmdParameters=config_overrides
ReturnToService=2
JobAcctGatherType=jobacct_gather/linux
JobAcctGatherFrequency=30
$ACCT_CONF
MinJobAge=300
KillWait=5
InactiveLimit=0
SlurmctldTimeout=30
SlurmdTimeout=60
NodeName=$NODE CPUs=$NCPUS RealMemory=$MEM_MB Gres=gpu:$NGPUS State=UNKNOWN
PartitionName=hpg-turin Nodes=$NODE Default=YES MaxTime=INFINITE State=UP
PartitionName=hpg-b200 Nodes=$NODE Default=NO MaxTime=INFINITE State=UP
EOF
install_file /etc/slurm/gres.conf 0644 <<EOF && conf_changed=1 || true
AutoDetect=off
NodeName=$NODE Name=gpu File=$LAB/fakegpu/nvidia[0-$((NGPUS - 1))]
EOF

# ---------------------------------------------------------------- 6. MariaDB + slurmdbd
if [ "$WITH_DBD" = 1 ]; then
  install_file /etc/mysql/mariadb.conf.d/99-slurmlab.cnf 0644 <<'EOF' || true
[mysqld]
innodb_buffer_pool_size=256M
innodb_lock_wait_timeout=900
EOF
  if mysqladmin ping >/dev/null 2>&1; then
    log "mariadb already running"
  else
    /etc/init.d/mariadb start >/dev/null
    wait_for 60 "mariadb" mysqladmin ping
    log "mariadb started"
  fi
  mysql -u root <<EOF
CREATE USER IF NOT EXISTS 'slurm'@'localhost' IDENTIFIED BY '$DBPASS';
GRANT ALL ON slurm_acct_db.* TO 'slurm'@'localhost';
FLUSH PRIVILEGES;
EOF
  dbd_changed=0
  install_file /etc/slurm/slurmdbd.conf 0600 <<EOF && dbd_changed=1 || true
AuthType=auth/munge
DbdHost=localhost
DbdPort=6819
SlurmUser=root
StorageType=accounting_storage/mysql
StorageHost=localhost
StoragePort=3306
StorageUser=slurm
StoragePass=$DBPASS
StorageLoc=slurm_acct_db
PidFile=/run/slurmdbd.pid
LogFile=/var/log/slurm/slurmdbd.log
DebugLevel=info
EOF
  if pid_alive /run/slurmdbd.pid && [ "$dbd_changed" = 0 ]; then
    log "slurmdbd already running"
  else
    stop_pidfile /run/slurmdbd.pid
    slurmdbd
    # port 6819 answers once slurmdbd is up (sacctmgr needs slurm.conf, written above)
    wait_for 60 "slurmdbd" sacctmgr -n list cluster
    log "slurmdbd started"
  fi
  if ! sacctmgr -n -P list cluster format=cluster | grep -qx "$CLUSTER"; then
    sacctmgr -i add cluster "$CLUSTER" >/dev/null
    log "cluster $CLUSTER registered in slurmdbd"
  fi
fi

# ---------------------------------------------------------------- 7. slurmctld
if pid_alive /run/slurmctld.pid && [ "$conf_changed" = 0 ]; then
  log "slurmctld already running"
else
  stop_pidfile /run/slurmctld.pid
  slurmctld
  wait_for 60 "slurmctld" sh -c 'scontrol ping | grep -q "is UP"'
  log "slurmctld started"
fi

# ---------------------------------------------------------------- 8. accounts and limits
if [ "$WITH_DBD" = 1 ]; then
  # the gres/gpu TRES is created in the DB by slurmctld (AccountingStorageTRES); GrpTRES needs it
  wait_for 60 "TRES gres/gpu in slurmdbd" sh -c 'sacctmgr -n -P list tres format=type,name | grep -qx "gres|gpu"'
  for spec in clive:3 maigan:2; do
    a=${spec%%:*}; g=${spec##*:}
    if sacctmgr -n -P list account "$a" format=account | grep -qx "$a"; then
      sacctmgr -i modify account where name="$a" cluster="$CLUSTER" set GrpTRES=gres/gpu="$g" >/dev/null || true
    else
      sacctmgr -i add account "$a" Cluster="$CLUSTER" Description="$a" Organization=lab GrpTRES=gres/gpu="$g" >/dev/null
    fi
  done
  for u in $ACCT_USERS; do
    for a in clive maigan; do
      sacctmgr -n -P list assoc user="$u" account="$a" format=account | grep -qx "$a" \
        || sacctmgr -i add user "$u" Account="$a" Cluster="$CLUSTER" >/dev/null
    done
    sacctmgr -i modify user where name="$u" cluster="$CLUSTER" set DefaultAccount=clive >/dev/null || true
  done
  log "accounts: $(sacctmgr -n -P list assoc format=account,user,grptres | tr '\n' ' ')"
fi

# ---------------------------------------------------------------- 9. slurmd
if pid_alive /run/slurmd.pid && [ "$conf_changed" = 0 ]; then
  log "slurmd already running"
else
  stop_pidfile /run/slurmd.pid
  slurmd
  log "slurmd started"
fi
# a node that registered with a bad config stays DRAIN/INVAL; resume it once the config is right
sleep 1
case "$(sinfo -h -n "$NODE" -o %t | head -1)" in
  *drain*|*down*|*inval*|*drng*) scontrol update nodename="$NODE" state=resume 2>/dev/null || true ;;
esac
wait_for 60 "node $NODE idle/mix/alloc" sh -c "sinfo -h -n $NODE -o %t | grep -Eq '^(idle|mix|alloc)'"
log "node ready: $(sinfo -h -N -o '%N %P %t %G %c %m' | tr '\n' ';')"

# ---------------------------------------------------------------- 10. jobs left from an earlier run
# This test cluster owns its queue. Jobs recovered from StateSaveLocation after an earlier run was
# killed (or a machine image saved mid-run) hold GPUs and the accounts' GrpTRES, so the smoke test
# and every test would queue behind them until they time out: cancel them and wait until they are gone.
left=$(squeue -h -o %i | tr '\n' ' ')
if [ -n "${left// /}" ]; then
  log "cancelling jobs left from an earlier run: $left"
  scancel $left 2>/dev/null || true
  wait_for 90 "jobs left from an earlier run to end" sh -c '[ -z "$(squeue -h -o %i)" ]'
fi

# ---------------------------------------------------------------- 11. smoke test
diagnose() { squeue -o '%i %j %a %P %T %r' >&2 || true; sinfo -R >&2 || true; sinfo -N -o '%N %t %G %c %m %O' >&2 || true; }
ACCT_OPT=""; [ "$WITH_DBD" = 1 ] && ACCT_OPT="-A clive"
out=$(timeout 60 srun $ACCT_OPT -p hpg-b200 --gres=gpu:1 -c1 --mem=100 sh -c 'echo $CUDA_VISIBLE_DEVICES') \
  || { diagnose; die "smoke test: srun --gres=gpu:1 did not run within 60 s (queue and node state above)"; }
[ -n "$out" ] || { diagnose; die "smoke test: CUDA_VISIBLE_DEVICES empty"; }
log "smoke test OK (srun --gres=gpu:1 -> CUDA_VISIBLE_DEVICES=$out)"

# ---------------------------------------------------------------- 12. python venv
if [ "$WITH_VENV" = 1 ]; then
  if [ -x "$VENV/bin/snakemake" ]; then
    log "venv already present: $VENV"
  else
    python3 -m venv "$VENV" 2>/dev/null || {
      DEBIAN_FRONTEND=noninteractive apt-get install -y -qq python3-venv >/dev/null
      python3 -m venv "$VENV"; }
    "$VENV/bin/pip" install -q "$SNAKEMAKE_SPEC" "$PLUGIN_SPEC"
    log "venv created: $VENV"
  fi
  log "python: $("$VENV/bin/snakemake" --version) / $("$VENV/bin/pip" show snakemake-executor-plugin-slurm 2>/dev/null | grep ^Version)"
fi
log "cluster ready"
