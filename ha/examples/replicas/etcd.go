// The embedded etcd the example starts when no -etcd is given, or serves
// alone with -serve-etcd: one member in a temporary directory, on loopback
// ports the kernel picks.

package main

import (
	"fmt"
	"net/url"
	"os"
	"os/signal"
	"syscall"
	"time"

	"go.etcd.io/etcd/server/v3/embed"
	"go.uber.org/zap"
)

// startEtcd starts an etcd server inside this process and returns its
// client address and a stop function that shuts it down and deletes its
// data.
func startEtcd() (addr string, stop func(), err error) {
	dir, err := os.MkdirTemp("", "replicas-etcd-")
	if err != nil {
		return "", nil, err
	}
	cfg := embed.NewConfig()
	cfg.Name = "example"
	cfg.Dir = dir
	// Port 0: the kernel picks a free port when etcd listens, so nothing
	// else can take it between a probe and the listen.
	loopback := url.URL{Scheme: "http", Host: "127.0.0.1:0"}
	cfg.ListenClientUrls = []url.URL{loopback}
	cfg.AdvertiseClientUrls = []url.URL{loopback}
	cfg.ListenPeerUrls = []url.URL{loopback}
	cfg.AdvertisePeerUrls = []url.URL{loopback}
	cfg.InitialCluster = cfg.InitialClusterFromName(cfg.Name)
	// Silent: what goes wrong at start comes back as an error, and the
	// shutdown logs "server closed" errors that are not.
	cfg.ZapLoggerBuilder = embed.NewZapLoggerBuilder(zap.NewNop())
	e, err := embed.StartEtcd(cfg)
	if err != nil {
		os.RemoveAll(dir)
		return "", nil, err
	}
	stop = func() {
		e.Close()
		os.RemoveAll(dir)
	}
	select {
	case <-e.Server.ReadyNotify():
	case err := <-e.Err():
		stop()
		return "", nil, err
	case <-time.After(30 * time.Second):
		stop()
		return "", nil, fmt.Errorf("embedded etcd not ready within 30s")
	}
	return e.Clients[0].Addr().String(), stop, nil
}

// serveEmbeddedEtcd starts the embedded etcd, prints its client address on
// a line of its own, and stops it on SIGINT or SIGTERM.
func serveEmbeddedEtcd() error {
	addr, stop, err := startEtcd()
	if err != nil {
		return err
	}
	defer stop()
	signals := make(chan os.Signal, 1)
	signal.Notify(signals, syscall.SIGINT, syscall.SIGTERM)
	fmt.Println(addr)
	<-signals
	return nil
}
