// Package compose holds the container testnet: docker-compose.yml (a relay
// on an "internet" network, two home-router containers doing the namespace
// testnet's NAT and firewall, nodes behind them, a client, a memory-limited
// "fit" profile) and testnet.sh, which builds the offline image, brings it
// up, checks it and tears it down. Its test, TestComposeTestnet, runs the
// whole cycle; `make test` runs it after every other package (make
// test-docker) so that it never overlaps the namespace NAT tests.
package compose
