// Command replicas runs replicas of a service on ha's Kubernetes store:
// twelve controllers shared by the replicas, each on one replica at a
// time, the group kept in the Lease objects of one namespace.
//
//	cd ha/kube/examples/replicas
//	go run .                                 # three replicas on a kube-apiserver started for them
//	go run . -listen 127.0.0.1:8080          # and each replica's placement page and readiness
//	go run . -kubeconfig ~/.kube/config -namespace my-service -replicas 1
//
// Given no cluster (no -kubeconfig, and not in a Pod) it starts an etcd
// and a kube-apiserver, the ones ha/kube's tests run against (built from
// the Go module proxy the first time, which takes minutes, then cached),
// applies deploy/rbac.yaml and runs the replicas as its ServiceAccount,
// which may keep Leases in namespace my-service and nothing more. In a
// Pod it runs as the Pod's ServiceAccount: deploy/deployment.yaml runs it
// so, one replica per Pod, named after the Pod.
//
// It prints the names each replica runs whenever that changes, and with
// -listen serves, for each replica, ha's placement page and its health:
//
//	/placement, /readyz                 the first replica's
//	/replicas/<id>/placement            who runs what, as replica <id> sees it
//	/replicas/<id>/readyz               replica <id>'s Health: 200, or 503 and why
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/sirupsen/logrus"

	"github.com/bgctl/controller"
	"github.com/bgctl/controller/ha"
	"github.com/bgctl/controller/ha/internal/examplekit"
	"github.com/bgctl/controller/ha/kube"
)

// options are the command's flags.
type options struct {
	replicas   int
	ids        string
	names      int
	ttl        time.Duration
	listen     string
	kubeconfig string
	namespace  string
	group      string
	duration   time.Duration
	verbose    bool
}

func main() {
	var o options
	flag.IntVar(&o.replicas, "replicas", 3, "how many replicas this process runs, r0, r1, …, unless -id names them")
	flag.StringVar(&o.ids, "id", "", "the IDs of the replicas this process runs, comma-separated (in a Pod: its name)")
	flag.IntVar(&o.names, "names", 12, "how many controllers the replicas share")
	flag.DurationVar(&o.ttl, "ttl", 5*time.Second, "the lease duration, whole seconds: how long a crashed replica's names wait")
	flag.StringVar(&o.listen, "listen", "", "serve the placement pages and readiness on this host:port (port 0: any)")
	flag.StringVar(&o.kubeconfig, "kubeconfig", "", "run on the cluster of this kubeconfig; empty: in a Pod its own cluster, else a kube-apiserver started here")
	flag.StringVar(&o.namespace, "namespace", "", "the namespace of the group's Leases; empty: the kubeconfig's context's (in a Pod its own); my-service on a server started here")
	flag.StringVar(&o.group, "group", "replicas-example", "the group's name, the prefix of its Lease names")
	flag.DurationVar(&o.duration, "duration", 0, "leave after this long; 0: on SIGINT or SIGTERM")
	flag.BoolVar(&o.verbose, "v", false, "log the replicas' claims and releases")
	examplekit.Main("replicas", func() error { return run(o) })
}

// run starts the replicas, each with every controller, until SIGINT,
// SIGTERM or o.duration, then has them leave. On a server it started, the
// whole group runs here: it then also checks that each name ran on one
// replica at the end.
func run(o options) error {
	ids, err := replicaIDs(o)
	if err != nil {
		return err
	}
	// Before the signals are caught: Ctrl-C ends a first build of the
	// servers, which takes minutes.
	c, err := connect(context.Background(), o.kubeconfig, o.namespace)
	if err != nil {
		return err
	}
	defer c.stop()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if o.duration > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, o.duration)
		defer cancel()
	}
	// A join or a leave writes a bucket Lease per name it moves (at most
	// 256): client-go's default 5 requests a second would spread that
	// over seconds.
	c.cfg.QPS, c.cfg.Burst = 20, 50
	fmt.Printf("replicas %s on %s, namespace %s, group %s\n", strings.Join(ids, ", "), c.cfg.Host, c.namespace, o.group)

	logger := logrus.New()
	logger.SetLevel(logrus.WarnLevel)
	if o.verbose {
		logger.SetLevel(logrus.InfoLevel)
	}
	names := make([]string, o.names)
	for i := range names {
		names[i] = fmt.Sprintf("job-%02d", i)
	}
	t := examplekit.NewTally()
	var rs []*ha.Replica
	defer func() { // every replica made leaves, whatever went wrong
		leaveCtx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		for _, r := range rs {
			if err := r.Leave(leaveCtx); err != nil {
				fmt.Fprintf(os.Stderr, "replicas: %s: leave: %v\n", r.ID(), err)
			}
		}
	}()
	for _, id := range ids {
		r, err := ha.New(kube.Store(c.cfg, c.namespace, kube.StoreOptions{}),
			ha.Options{Prefix: o.group, ID: id, TTL: o.ttl, Logger: logger})
		if err != nil {
			return err
		}
		rs = append(rs, r)
		for _, name := range names {
			err := r.UpdateController(name, controller.ControllerParams{
				DoFunc: func(ctx context.Context) error {
					defer t.Start(name, id)()
					<-ctx.Done() // works until its replica stops it
					return nil
				},
				RunInterval: time.Second,
			})
			if err != nil {
				return err
			}
		}
		joinCtx, cancel := context.WithTimeout(ctx, 30*time.Second)
		err = r.Join(joinCtx)
		cancel()
		if err != nil {
			return fmt.Errorf("%s: join: %w", id, err)
		}
	}
	if o.listen != "" {
		stopServing, err := examplekit.Serve(o.listen, rs)
		if err != nil {
			return err
		}
		defer stopServing()
	}

	start := time.Now()
	tick := time.NewTicker(250 * time.Millisecond)
	defer tick.Stop()
	last := ""
	for done := false; !done; {
		select {
		case <-ctx.Done():
			done = true
		case <-tick.C:
		}
		if line := t.Line(ids); line != last {
			fmt.Printf("%6v  %s\n", time.Since(start).Round(100*time.Millisecond), line)
			last = line
		}
	}
	var errs []error
	if c.whole {
		errs = append(errs, t.Placed(names))
	}
	starts, overlaps := t.Counts()
	fmt.Printf("%d starts; %d while the name ran on another replica\n", starts, overlaps)
	if overlaps > 0 {
		errs = append(errs, fmt.Errorf("%d names started while they ran on another replica", overlaps))
	}
	return errors.Join(errs...)
}

// replicaIDs returns the IDs -id names, else r0 … r<-replicas − 1>.
func replicaIDs(o options) ([]string, error) {
	if o.ids != "" {
		return strings.Split(o.ids, ","), nil
	}
	if o.replicas < 1 {
		return nil, fmt.Errorf("-replicas %d: want at least one", o.replicas)
	}
	ids := make([]string, o.replicas)
	for i := range ids {
		ids[i] = fmt.Sprintf("r%d", i)
	}
	return ids, nil
}
