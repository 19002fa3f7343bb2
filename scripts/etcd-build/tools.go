//go:build tools

// Package tools pins the etcd server command so go.sum covers it.
package tools

import _ "go.etcd.io/etcd/server/v3"
