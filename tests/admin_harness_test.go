//go:build e2e

package tests

import (
	"strconv"
	"strings"
	"sync"
	"testing"
)

// adminAddrs maps the --http-addr of each service the suite started to its
// admin listener's address (--admin-addr), where /debug/* lives.
var adminAddrs sync.Map // string -> string

// withAdminAddr gives a service its own admin port unless args or env name
// one: the services' default admin ports are fixed, and a test often runs
// several of one service. It records the port under the --http-addr.
func withAdminAddr(t testing.TB, args, env []string) []string {
	t.Helper()
	admin := flagValue(args, env, "admin-addr")
	if admin == "" {
		admin = "127.0.0.1:" + strconv.Itoa(freePorts(t, 1)[0])
		env = append(append([]string(nil), env...), "BATON_ADMIN_ADDR="+admin)
	}
	if h := flagValue(args, env, "http-addr"); h != "" {
		adminAddrs.Store(h, admin)
	}
	return env
}

// adminOf is the admin address of the service serving HTTP at httpAddr
// (httpAddr itself for a service the suite did not start, whose /debug/*
// then answers 404).
func adminOf(httpAddr string) string {
	if a, ok := adminAddrs.Load(httpAddr); ok {
		return a.(string)
	}
	return httpAddr
}

// flagValue is --name's value in args, else BATON_NAME's in env.
func flagValue(args, env []string, name string) string {
	for i, a := range args {
		if (a == "--"+name || a == "-"+name) && i+1 < len(args) {
			return args[i+1]
		}
		if v, ok := strings.CutPrefix(a, "--"+name+"="); ok {
			return v
		}
	}
	key := "BATON_" + strings.ToUpper(strings.ReplaceAll(name, "-", "_")) + "="
	for _, e := range env {
		if v, ok := strings.CutPrefix(e, key); ok {
			return v
		}
	}
	return ""
}
