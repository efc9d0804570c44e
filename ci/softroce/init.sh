#!/bin/busybox sh
# PID 1 of the Soft-RoCE VM (busybox sh, from the initramfs that ci/softroce.sh builds).
# Loads the modules, builds the guest's root from the host's / (9p, read-only) under a
# tmpfs overlay, mounts the writable results share, then runs /softroce/guest.sh (bash,
# from the host) chrooted into that root. Whatever happens, it ends in `poweroff -f`:
# a script as PID 1 that merely exits panics the kernel, and plain `poweroff` only
# signals an init that isn't there (pitfall 10).
# shellcheck shell=sh

/bin/busybox --install -s /bin
export PATH=/bin
mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev

say() { echo "softroce-init: $*"; }
halt() {
  say "$*"
  sync
  poweroff -f
}

# No modprobe and no udev here: the host resolved the dependency order into modules.list.
# rxe needs a crc32 shash that nothing would autoload (pitfall 2), tc can't autoload qdiscs.
kver=$(uname -r)
while read -r module; do
  insmod "/lib/modules/$kver/$module" || say "insmod $module failed"
done </modules.list
say "modules loaded"

# msize: the 9p default (8 KiB) makes every read of a test binary many round trips;
# 512000 is the most virtio takes.
p9='trans=virtio,version=9p2000.L,msize=512000'
mkdir -p /lower /rw /newroot
# cache=loose: the host root is read-only for the whole run, so caching it is safe and
# saves a 9p round trip per stat under TCG.
mount -t 9p -o "$p9,ro,cache=loose" hostroot /lower || halt "cannot mount the host root (9p)"

# Writes anywhere (ctest's Testing/, a test's temp files) land in RAM and vanish with the VM;
# the host only ever gets files through the results share.
mount -t tmpfs -o mode=0755 rw /rw
mkdir -p /rw/upper /rw/work
if mount -t overlay -o lowerdir=/lower,upperdir=/rw/upper,workdir=/rw/work overlay /newroot; then
  root_kind=overlay
else
  say "overlay over 9p failed; the root stays read-only, /tmp is a fresh tmpfs"
  mount -o bind /lower /newroot
  mount -t tmpfs -o mode=1777 tmp /newroot/tmp
  root_kind=ro
fi

r=/newroot
mount -t proc proc $r/proc
mount -t sysfs sysfs $r/sys
mount -t devtmpfs devtmpfs $r/dev
mkdir -p $r/dev/shm $r/dev/pts
mount -t tmpfs -o mode=1777 shm $r/dev/shm   # POSIX shm (sidecar queues)
mount -t devpts devpts $r/dev/pts
ln -sf /proc/self/fd $r/dev/fd               # bash process substitution
ln -sf /proc/self/fd/0 $r/dev/stdin
ln -sf /proc/self/fd/1 $r/dev/stdout
ln -sf /proc/self/fd/2 $r/dev/stderr
mount -t tmpfs -o mode=0755 run $r/run       # the host's /run (pid files, sockets) means nothing here
mkdir -p $r/run/softroce
cp /softroce/* $r/run/softroce/
echo "$root_kind" >$r/run/softroce/root_kind

# The results share appears at the same absolute path as on the host. Mounted last, so a
# path under /tmp is not hidden by a tmpfs mounted after it.
read -r out_dir </softroce/out_dir
mkdir -p "$r$out_dir" || halt "cannot create mount point $out_dir"
mount -t 9p -o "$p9,cache=mmap" out "$r$out_dir" || halt "cannot mount the results share $out_dir"

hostname softroce
say "root: host / ($root_kind), results share at $out_dir; starting guest.sh"
chroot $r /bin/bash /run/softroce/guest.sh
say "guest.sh exited $?"
umount "$r$out_dir" 2>/dev/null
halt "powering off"
