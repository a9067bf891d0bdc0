// The run: the program under test started against an etcd, and what the
// etcd must hold while the program runs and after it has left.

package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"syscall"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
)

// run starts PROGRAM -etcd ADDR and checks that it joins (its controller
// writes -key through its claim), and that on SIGTERM it exits 0 having
// left (nothing under -prefix).
func run(args []string) error {
	fs := flag.NewFlagSet("run", flag.ContinueOnError)
	addr := fs.String("etcd", "", "the etcd's client address, host:port")
	prefix := fs.String("prefix", "", "the program's ha.Options.Prefix")
	key := fs.String("key", "", "the key the program's controller writes through its claim")
	within := fs.Duration("within", 30*time.Second, "how long the program may take to write -key")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *addr == "" || *prefix == "" || *key == "" || fs.NArg() != 1 {
		return errors.New("run: want -etcd ADDR -prefix P -key K PROGRAM")
	}
	program := fs.Arg(0)

	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{*addr}, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		return err
	}
	defer cli.Close()

	// A clean slate, so that what the checks below see is this program's.
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	_, err = cli.Delete(ctx, *key)
	cancel()
	if err != nil {
		return fmt.Errorf("run: %w", err)
	}
	if n, err := count(cli, *prefix+"/", true); err != nil || n != 0 {
		return fmt.Errorf("run: %d keys under %s/ before the program started, want 0 (%v)", n, *prefix, err)
	}

	cmd := exec.Command(program, "-etcd", *addr)
	cmd.Stdout, cmd.Stderr = os.Stdout, os.Stderr
	if err := cmd.Start(); err != nil {
		return err
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }() // joined on every path below
	kill := func() {
		_ = cmd.Process.Kill()
		<-exited
	}

	// Joined and ran: the controller's guarded write reached etcd.
	for deadline := time.Now().Add(*within); ; {
		if n, err := count(cli, *key, false); err == nil && n == 1 {
			break
		}
		if time.Now().After(deadline) {
			kill()
			return fmt.Errorf("run: %s did not write %s within %v", program, *key, *within)
		}
		select {
		case err := <-exited:
			return fmt.Errorf("run: %s exited before it wrote %s: %v", program, *key, err)
		case <-time.After(100 * time.Millisecond):
		}
	}
	claims, err := count(cli, *prefix+"/claims/", true)
	if err != nil || claims != 1 {
		kill()
		return fmt.Errorf("run: %d claims under %s/claims/ while it runs, want 1 (%v)", claims, *prefix, err)
	}
	fmt.Printf("run: %s joined, holds 1 claim, and its controller wrote %s\n", program, *key)

	// Left: SIGTERM ends it through Leave, which deletes its member key and
	// its claims before it returns.
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		kill()
		return err
	}
	select {
	case err := <-exited:
		if err != nil {
			return fmt.Errorf("run: %s after SIGTERM: %w", program, err)
		}
	case <-time.After(20 * time.Second):
		kill()
		return fmt.Errorf("run: %s did not exit within 20s of SIGTERM", program)
	}
	left, err := count(cli, *prefix+"/", true)
	if err != nil {
		return err
	}
	if left != 0 {
		return fmt.Errorf("run: %d keys left under %s/ after the program left, want 0", left, *prefix)
	}
	fmt.Printf("run: %s left on SIGTERM, exit status 0, nothing left under %s/\n", program, *prefix)
	return nil
}

// count returns how many keys are at key (or under it, with prefix).
func count(cli *clientv3.Client, key string, prefix bool) (int64, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	opts := []clientv3.OpOption{clientv3.WithCountOnly()}
	if prefix {
		opts = append(opts, clientv3.WithPrefix())
	}
	resp, err := cli.Get(ctx, key, opts...)
	if err != nil {
		return 0, err
	}
	return resp.Count, nil
}
