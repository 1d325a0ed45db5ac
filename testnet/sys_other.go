//go:build !linux

package testnet

import "syscall"

// The namespace test network is Linux only (ip netns, iptables): on other
// systems Check fails before anything is started, and these only let the
// package (and `meshp2p testnet`, which says so) compile.

func groupAttr() *syscall.SysProcAttr { return nil }

func killPID(int) {}

func pidExists(int) bool { return false }
