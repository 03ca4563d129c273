// Command etcd is upstream etcd's server entry point (go.etcd.io/etcd/v3's main.go does the
// same), in a module of its own so its dependencies are not bumped by Kubernetes'.
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() {
	etcdmain.Main(os.Args)
}
