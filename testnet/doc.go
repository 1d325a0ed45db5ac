// Package testnet builds NAT test networks out of Linux network namespaces
// and runs processes inside them: the proof that meshp2p nodes find each
// other, connect through a relay and hole-punch from behind home NATs.
//
// A topology (see Spec) has:
//
//   - <prefix>-inet: the "internet", a bridge br0 with no address, on
//     TEST-NET-3 203.0.113.0/24 by default (never 192.0.2.0/24: this
//     machine's own eth0 lives there);
//   - public nodes (bootstrap / relay / tracker) at 203.0.113.10, .11, …;
//   - home routers at 203.0.113.100, .101, … (WAN "wan"), each with a LAN
//     bridge "lan" on 10.0.<i+1>.0/24 (router .1), doing source NAT out of
//     the WAN — port-preserving (MASQUERADE) or symmetric
//     (MASQUERADE --random-fully) — behind a home-router firewall that
//     drops unsolicited inbound traffic on the WAN (needed for hole
//     punching to work; measured 0/10 without it);
//   - hosts on each LAN at .2, .3, …, default route via their router.
//
// Every veth is created directly inside the namespaces (`ip -n A link add
// … peer … netns B`); forwarding and NAT are switched on only inside the
// router namespaces. Nothing in the root namespace changes, and Up refuses
// address plans that overlap this machine's own interfaces.
//
// Names: namespace <prefix>-<node> (prefix ≤ 8, node ≤ 6 characters, so
// ≤ 15); interface names are fixed per namespace (eth0, wan, lan, br0,
// p<i>, r<i>, h<j>) and do not depend on the prefix.
//
// Teardown: Close kills processes by PID (those started with Start, then
// anything `ip netns pids` still lists) and deletes the namespaces.
// Cleanup(prefix) does the same for a topology left by an interrupted run
// or by `meshp2p testnet up`. Children get SIGKILL as parent-death signal,
// so a killed test binary takes its children with it; SweepStale (called
// by NewT) removes namespaces of test prefixes whose process is gone.
//
// Processes: (*Topology).Start runs a command through `ip netns exec`,
// recording its PID and capturing stdout/stderr to files (stdout lines are
// also kept for WaitLine/WaitEvent). Tests re-execute their own binary
// with StartSelf(ctx, node, role, args...) and dispatch on ChildRole() in
// TestMain; children report readiness and results as JSON lines
// ({"event": "ready", ...}) on stdout.
//
// Privileges: root (CAP_SYS_ADMIN for `ip netns add`, CAP_NET_ADMIN for
// links and iptables). NewT skips without them (fails instead when
// MESHP2P_TESTNET_REQUIRE=1). testnet/deps.sh installs iproute2 and
// iptables when run as root. iptables: whatever `iptables` resolves to;
// Debian 12's default is iptables-nft (nf_tables backend, 1.8.9), which is
// what this was built and measured with (legacy works too; the rules used
// — conntrack, MASQUERADE [--random-fully] — exist in both). Rules are
// loaded per router with one iptables-restore.
//
// libp2p in a testnet: 203.0.113.0/24 and 10.0.0.0/8 are "not public" to
// go-multiaddr, and libp2p never hole-punches without public addresses.
// Nodes must mark the internet segment public in test mode only (p2p's
// TestMode option; raw libp2p: remove it from manet.Unroutable4), relays
// must relax their per-IP connection limits for it, and the relay must be
// ready before NATed nodes start (a failed first reservation makes
// autorelay back off for an hour).
package testnet
