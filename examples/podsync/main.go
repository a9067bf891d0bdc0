// Command podsync re-creates the job of a virtual-kubelet style pod
// controller: keep the pods of a provider (a cloud's container service, say)
// in step with the pods an informer reports.
//
// Every pod key gets a controller of its own. Each informer event (add,
// update, delete) updates that controller, which runs at once: its DoFunc
// reads the informer and creates, updates or deletes the pod in the
// provider. The provider fails now and then; a failure is retried with
// backoff, at most 20 times in a row (MaxRetries), after which the
// controller gives up and its status says so. Once a pod is deleted from
// the provider, its controller is removed with RemoveControllerAndWait.
// At start, a one-shot controller deletes the dangling pods the provider
// has but the informer does not, and ends with an ExitReason.
//
//	go run ./examples/podsync -duration 12s
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"os/signal"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/bgctl/controller"
	"github.com/sirupsen/logrus"
)

// Pod is the part of a pod this example cares about.
type Pod struct {
	Namespace, Name string
	Image           string
}

// Key is namespace/name, the pod's identity.
func (p Pod) Key() string { return p.Namespace + "/" + p.Name }

type eventType string

const (
	added   eventType = "add"
	updated eventType = "update"
	deleted eventType = "delete"
)

type event struct {
	Type eventType
	Key  string
}

// informer is a fake pod informer: a store of the pods the cluster wants,
// and a stream of events about them. As with a real informer, the store is
// updated before the event is delivered, so whoever reads the store may be
// ahead of the events. Its mutators are called from one goroutine.
type informer struct {
	mu      sync.Mutex
	pods    map[string]Pod
	version map[string]uint64 // per key: the version of its last event
	last    uint64
	events  chan event
}

func newInformer(initial ...Pod) *informer {
	inf := &informer{
		pods:    make(map[string]Pod),
		version: make(map[string]uint64),
		events:  make(chan event, 1024),
	}
	for _, p := range initial {
		inf.Add(p)
	}
	return inf
}

func (inf *informer) set(t eventType, key string, p *Pod) {
	inf.mu.Lock()
	if p != nil {
		inf.pods[key] = *p
	} else {
		delete(inf.pods, key)
	}
	inf.last++
	inf.version[key] = inf.last
	inf.mu.Unlock()
	inf.events <- event{Type: t, Key: key}
}

// Add adds a pod.
func (inf *informer) Add(p Pod) { inf.set(added, p.Key(), &p) }

// Update replaces a pod.
func (inf *informer) Update(p Pod) { inf.set(updated, p.Key(), &p) }

// Delete deletes the pod with the given key.
func (inf *informer) Delete(key string) { inf.set(deleted, key, nil) }

// Get returns the pod under key, whether it exists, and the version of the
// last event about the key.
func (inf *informer) Get(key string) (Pod, bool, uint64) {
	inf.mu.Lock()
	defer inf.mu.Unlock()
	p, ok := inf.pods[key]
	return p, ok, inf.version[key]
}

// Images returns key → image of every pod.
func (inf *informer) Images() map[string]string {
	inf.mu.Lock()
	defer inf.mu.Unlock()
	out := make(map[string]string, len(inf.pods))
	for k, p := range inf.pods {
		out[k] = p.Image
	}
	return out
}

// Events delivers the events, in order.
func (inf *informer) Events() <-chan event { return inf.events }

var (
	errPodNotFound = errors.New("pod not found")
	errTransient   = errors.New("provider temporarily unavailable")
	errImagePull   = errors.New("image pull failed: repository does not exist")
)

// provider is a fake pod provider. Its calls fail when its transient
// policy says so, and always for images from registry.invalid.
type provider struct {
	mu        sync.Mutex
	pods      map[string]Pod
	calls     map[string]int // create, update and delete calls, by key
	transient func() bool    // called under mu
}

func newProvider(transient func() bool, pods ...Pod) *provider {
	if transient == nil {
		transient = func() bool { return false }
	}
	p := &provider{pods: make(map[string]Pod), calls: make(map[string]int), transient: transient}
	for _, pod := range pods {
		p.pods[pod.Key()] = pod
	}
	return p
}

// randomFailures fails a call with probability rate, from a generator
// seeded with seed so that a run can be repeated.
func randomFailures(seed uint64, rate float64) func() bool {
	rng := rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
	return func() bool { return rng.Float64() < rate }
}

// call counts a call about key and returns the error it fails with, if
// any. The caller holds p.mu.
func (p *provider) call(ctx context.Context, key string) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	p.calls[key]++
	if p.transient() {
		return errTransient
	}
	return nil
}

// CreatePod starts a pod.
func (p *provider) CreatePod(ctx context.Context, pod Pod) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if strings.HasPrefix(pod.Image, "registry.invalid/") && ctx.Err() == nil {
		p.calls[pod.Key()]++
		return fmt.Errorf("create %s: %s: %w", pod.Key(), pod.Image, errImagePull)
	}
	if err := p.call(ctx, pod.Key()); err != nil {
		return fmt.Errorf("create %s: %w", pod.Key(), err)
	}
	p.pods[pod.Key()] = pod
	return nil
}

// UpdatePod replaces a running pod.
func (p *provider) UpdatePod(ctx context.Context, pod Pod) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if err := p.call(ctx, pod.Key()); err != nil {
		return fmt.Errorf("update %s: %w", pod.Key(), err)
	}
	if _, ok := p.pods[pod.Key()]; !ok {
		return fmt.Errorf("update %s: %w", pod.Key(), errPodNotFound)
	}
	p.pods[pod.Key()] = pod
	return nil
}

// DeletePod deletes a pod.
func (p *provider) DeletePod(ctx context.Context, key string) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if err := p.call(ctx, key); err != nil {
		return fmt.Errorf("delete %s: %w", key, err)
	}
	if _, ok := p.pods[key]; !ok {
		return fmt.Errorf("delete %s: %w", key, errPodNotFound)
	}
	delete(p.pods, key)
	return nil
}

// GetPod returns the pod under key.
func (p *provider) GetPod(key string) (Pod, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	pod, ok := p.pods[key]
	return pod, ok
}

// ListPods returns every pod, sorted by key.
func (p *provider) ListPods(ctx context.Context) ([]Pod, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	if p.transient() {
		return nil, fmt.Errorf("list pods: %w", errTransient)
	}
	pods := make([]Pod, 0, len(p.pods))
	for _, pod := range p.pods {
		pods = append(pods, pod)
	}
	slices.SortFunc(pods, func(a, b Pod) int { return strings.Compare(a.Key(), b.Key()) })
	return pods, nil
}

// Images returns key → image of every pod.
func (p *provider) Images() map[string]string {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := make(map[string]string, len(p.pods))
	for k, pod := range p.pods {
		out[k] = pod.Image
	}
	return out
}

// Calls returns how many create, update and delete calls were made about
// key.
func (p *provider) Calls(key string) int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.calls[key]
}

// maxPodRetries is how many failures in a row a pod's controller takes
// before it gives up until the pod's next event.
const maxPodRetries = 20

// danglingCleanup is the name of the one-shot controller that deletes the
// provider's pods the informer does not know.
const danglingCleanup = "pod-dangling-cleanup"

func podControllerName(key string) string { return "pod-sync/" + key }

// podController keeps a provider in step with an informer. It embeds a
// Manager, so its controllers live and die with it.
type podController struct {
	controller.Manager

	informer *informer
	provider *provider
	logf     func(format string, args ...any)

	// Keys whose pod the provider no longer has, with the informer version
	// the DoFunc saw; the loop removes their controllers.
	doneMu sync.Mutex
	done   map[string]uint64
	doneC  chan struct{} // capacity 1: "done has entries"

	cleanedUp *closeOnOK // the dangling-pod cleanup has finished
}

// closeOnOK is a HealthReporter that closes ch after the first successful
// run, an ExitReason included.
type closeOnOK struct {
	once sync.Once
	ch   chan struct{}
}

// OK closes the channel, the first time.
func (c *closeOnOK) OK(string) { c.once.Do(func() { close(c.ch) }) }

// Degraded does nothing: a failed run is retried.
func (c *closeOnOK) Degraded(string, error) {}

func newPodController(inf *informer, prov *provider, logf func(string, ...any), opts ...controller.Option) *podController {
	pc := &podController{
		informer: inf, provider: prov, logf: logf,
		done: make(map[string]uint64), doneC: make(chan struct{}, 1),
		cleanedUp: &closeOnOK{ch: make(chan struct{})},
	}
	// Options configure the embedded Manager before its first use, as
	// NewManager would.
	for _, o := range opts {
		o(&pc.Manager)
	}
	return pc
}

// Run deletes the dangling pods, and once that is done handles informer
// events and removes the controllers of deleted pods until ctx ends. It is
// the one goroutine that installs and removes pod controllers, so an event
// and a removal for the same key never race.
func (pc *podController) Run(ctx context.Context) {
	pc.UpdateController(danglingCleanup, controller.ControllerParams{
		Group:                  controller.NewGroup("pod-gc"),
		DoFunc:                 pc.deleteDangling(),
		ErrorRetryBaseDuration: 100 * time.Millisecond,
		Health:                 pc.cleanedUp,
	})
	// Pod controllers start after the cleanup, so that it judges the
	// provider against the informer's initial state only.
	select {
	case <-pc.CleanedUp():
	case <-ctx.Done():
		return
	}
	for {
		select {
		case ev := <-pc.informer.Events():
			// Every event is an update: it runs the DoFunc at once and
			// restarts the backoff and the MaxRetries count.
			pc.UpdateController(podControllerName(ev.Key), pc.podParams(ev.Key))
		case <-pc.doneC:
			pc.removeDeleted()
		case <-ctx.Done():
			return
		}
	}
}

// CleanedUp is closed once the dangling pods are deleted.
func (pc *podController) CleanedUp() <-chan struct{} { return pc.cleanedUp.ch }

func (pc *podController) podParams(key string) controller.ControllerParams {
	return controller.ControllerParams{
		Group:                  controller.NewGroup("pod-sync"),
		DoFunc:                 pc.syncPod(key),
		ErrorRetryBaseDuration: 50 * time.Millisecond,
		MaxRetryInterval:       500 * time.Millisecond,
		MaxRetries:             maxPodRetries,
	}
}

// syncPod returns the DoFunc of key's controller: make the provider's pod
// what the informer says, one call at most.
func (pc *podController) syncPod(key string) controller.ControllerFunc {
	return func(ctx context.Context) error {
		want, exists, version := pc.informer.Get(key)
		have, running := pc.provider.GetPod(key)
		switch {
		case exists && !running:
			return pc.provider.CreatePod(ctx, want)
		case exists && have != want:
			return pc.provider.UpdatePod(ctx, want)
		case exists:
			return nil
		}
		if running {
			if err := pc.provider.DeletePod(ctx, key); err != nil && !errors.Is(err, errPodNotFound) {
				return err
			}
		}
		pc.markDone(key, version)
		return controller.NewExitReason("pod deleted from the provider")
	}
}

func (pc *podController) markDone(key string, version uint64) {
	pc.doneMu.Lock()
	pc.done[key] = version
	pc.doneMu.Unlock()
	select {
	case pc.doneC <- struct{}{}:
	default:
	}
}

// removeDeleted removes the controllers of pods deleted from the provider,
// unless an event came for the key since its DoFunc looked: then that
// event's update has the controller run again.
func (pc *podController) removeDeleted() {
	pc.doneMu.Lock()
	done := pc.done
	pc.done = make(map[string]uint64)
	pc.doneMu.Unlock()
	keys := make([]string, 0, len(done))
	for k := range done {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	for _, key := range keys {
		if _, exists, version := pc.informer.Get(key); exists || version != done[key] {
			continue
		}
		if err := pc.RemoveControllerAndWait(podControllerName(key)); err == nil {
			pc.logf("pod %s deleted; its controller is removed", key)
		}
	}
}

// deleteDangling returns the DoFunc of the one-shot cleanup. A failed run
// is retried; pods deleted by earlier runs stay counted.
func (pc *podController) deleteDangling() controller.ControllerFunc {
	var deletedPods []string // only this DoFunc touches it; runs never overlap
	return func(ctx context.Context) error {
		pods, err := pc.provider.ListPods(ctx)
		if err != nil {
			return err
		}
		for _, p := range pods {
			if _, exists, _ := pc.informer.Get(p.Key()); exists {
				continue
			}
			if err := pc.provider.DeletePod(ctx, p.Key()); err != nil && !errors.Is(err, errPodNotFound) {
				return err
			}
			deletedPods = append(deletedPods, p.Key())
		}
		return controller.NewExitReason(fmt.Sprintf("deleted %d dangling pods: %s",
			len(deletedPods), strings.Join(deletedPods, ", ")))
	}
}

// config is what run does; the options change it.
type config struct {
	duration      time.Duration
	eventInterval time.Duration
	settle        time.Duration // no events during the last settle of the run
	seed          uint64
	failRate      float64
	logger        logrus.FieldLogger
}

type option func(*config)

func withDuration(d time.Duration) option    { return func(c *config) { c.duration = d } }
func withLogger(l logrus.FieldLogger) option { return func(c *config) { c.logger = l } }
func withSeed(seed uint64) option            { return func(c *config) { c.seed = seed } }

// brokenPod's image cannot be pulled, so its controller gives up.
var brokenPod = Pod{Namespace: "default", Name: "broken", Image: "registry.invalid/app:1"}

func defaultWorld(seed uint64, failRate float64) (*informer, *provider) {
	var pods []Pod
	for i := range 4 {
		pods = append(pods, Pod{Namespace: "default", Name: fmt.Sprintf("web-%d", i), Image: "nginx:1.27"})
	}
	inf := newInformer(append(pods, brokenPod)...)
	prov := newProvider(randomFailures(seed, failRate),
		pods[0], // already running
		Pod{Namespace: "default", Name: "orphan-a", Image: "busybox:1.36"},
		Pod{Namespace: "kube-system", Name: "orphan-b", Image: "busybox:1.36"},
	)
	return inf, prov
}

// run syncs the provider with the informer while random pod events arrive,
// stops the events for the last seconds so the provider can converge, and
// reports how it ended.
func run(ctx context.Context, out io.Writer, opts ...option) error {
	cfg := config{
		duration:      12 * time.Second,
		eventInterval: 400 * time.Millisecond,
		settle:        4 * time.Second,
		seed:          1,
		failRate:      0.3,
		logger:        logrus.StandardLogger(),
	}
	for _, o := range opts {
		o(&cfg)
	}
	inf, prov := defaultWorld(cfg.seed, cfg.failRate)

	start := time.Now()
	var outMu sync.Mutex
	logf := func(format string, args ...any) {
		outMu.Lock()
		defer outMu.Unlock()
		fmt.Fprintf(out, "%7v  %s\n", time.Since(start).Round(time.Millisecond), fmt.Sprintf(format, args...))
	}

	pc := newPodController(inf, prov, logf, controller.WithLogger(cfg.logger), controller.WithMetrics(nil))
	runCtx, stopRun := context.WithCancel(context.Background())
	ran := make(chan struct{})
	go func() { // joined below, before the controllers are shut down
		defer close(ran)
		pc.Run(runCtx)
	}()

	rng := rand.New(rand.NewPCG(cfg.seed, cfg.seed+1))
	quiet := time.NewTimer(max(cfg.duration-cfg.settle, 0))
	defer quiet.Stop()
	deadline := time.NewTimer(cfg.duration)
	defer deadline.Stop()
	// Events start once the dangling pods are gone.
	var events *time.Ticker
	var tick <-chan time.Time
	cleanedUp := pc.CleanedUp()
	next := 4
loop:
	for {
		select {
		case <-cleanedUp:
			cleanedUp = nil
			logf("%s: %v", danglingCleanup, pc.Lookup(danglingCleanup).GetLastError())
			events = time.NewTicker(cfg.eventInterval)
			defer events.Stop()
			tick = events.C
		case <-tick:
			next = randomEvent(inf, rng, next, logf)
		case <-quiet.C:
			tick = nil
			logf("no more events; letting the provider converge")
		case <-deadline.C:
			break loop
		case <-ctx.Done():
			break loop
		}
	}
	stopRun()
	<-ran

	fmt.Fprintln(out)
	if err := controller.FormatStatus(out, pc.GetStatusModel(), false); err != nil {
		return err
	}
	fmt.Fprintln(out)
	want, have := inf.Images(), prov.Images()
	delete(want, brokenPod.Key())
	if fmt.Sprint(want) == fmt.Sprint(have) {
		fmt.Fprintf(out, "provider matches the informer: %d pods (%s is given up)\n", len(have), brokenPod.Key())
	} else {
		fmt.Fprintf(out, "provider has not converged yet:\n  informer %v\n  provider %v\n", want, have)
	}
	for _, st := range pc.GetStatusModel() {
		if n := st.Configuration.MaxRetries; n > 0 && st.Status.ConsecutiveFailureCount >= n {
			fmt.Fprintf(out, "%s gave up after %d failures in a row: %s\n", st.Name, n, st.Status.LastFailureMsg)
		}
	}
	if c := pc.Lookup(danglingCleanup); c != nil {
		fmt.Fprintf(out, "%s: %v\n", danglingCleanup, c.GetLastError())
	}

	shutdownCtx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	return pc.Shutdown(shutdownCtx)
}

// randomEvent makes the informer add, update or delete a pod at random.
// next numbers the next new pod; it returns the number after it.
func randomEvent(inf *informer, rng *rand.Rand, next int, logf func(string, ...any)) int {
	var keys []string
	for k := range inf.Images() {
		if k != brokenPod.Key() {
			keys = append(keys, k)
		}
	}
	slices.Sort(keys)
	switch r := rng.IntN(4); {
	case r == 0 || len(keys) == 0:
		p := Pod{Namespace: "default", Name: fmt.Sprintf("web-%d", next), Image: "nginx:1.27"}
		logf("informer: add %s", p.Key())
		inf.Add(p)
		return next + 1
	case r == 1:
		key := keys[rng.IntN(len(keys))]
		logf("informer: delete %s", key)
		inf.Delete(key)
	default:
		key := keys[rng.IntN(len(keys))]
		p, _, _ := inf.Get(key)
		p.Image = fmt.Sprintf("nginx:1.%d", 27+rng.IntN(3))
		logf("informer: update %s to %s", key, p.Image)
		inf.Update(p)
	}
	return next
}

func main() {
	duration := flag.Duration("duration", 12*time.Second, "how long to run before shutting down")
	seed := flag.Uint64("seed", 1, "seed of the pod events and of the provider's failures")
	flag.Parse()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	log := logrus.New()
	log.SetLevel(logrus.InfoLevel)
	err := run(ctx, os.Stdout, withDuration(*duration), withSeed(*seed), withLogger(log))
	stop()
	if err != nil {
		fmt.Fprintln(os.Stderr, "podsync:", err)
		os.Exit(1)
	}
}
