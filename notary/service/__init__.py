"""The notary's services, async but without sockets: answering queries, refreshing targets, abuse controls, the rescan loop, watches and live figures."""
