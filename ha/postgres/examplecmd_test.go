// The example (examples/replicas) built and run as a user runs it: on a
// server it starts, and on a database given by -dsn.

package postgres

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"
)

// exampleNames is how many names the example's replicas share (its
// -names default).
const exampleNames = 12

// The example runs three replicas, serves a placement page that shows
// every name held by its owner, once, crashes one, and exits with
// status 0: no name ran on two replicas at once, and at the end every
// name ran on one. Run as `go run .` does (a server of its own, no
// DATABASE_URL) and with -dsn.
func TestExampleRunsThreeReplicas(t *testing.T) {
	t.Parallel()
	bin := filepath.Join(t.TempDir(), "replicas")
	if out, err := exec.Command("go", "build", "-o", bin, "./examples/replicas").CombinedOutput(); err != nil {
		t.Fatalf("go build ./examples/replicas: %v\n%s", err, out)
	}
	t.Run("on a server it starts", func(t *testing.T) {
		t.Parallel()
		runExample(t, bin)
	})
	t.Run("on the database of -dsn", func(t *testing.T) {
		t.Parallel()
		runExample(t, bin, "-dsn", testServer.DSN, "-group", newGroup("example"))
	})
}

// runExample runs the example with args for 12 s, a crash at 6 s,
// serving its pages; it fails t unless the placement page shows every
// name placed once and the example exits with status 0, having seen the
// crashed replica's names taken over.
func runExample(t *testing.T, bin string, args ...string) {
	cmd := exec.Command(bin, append([]string{"-listen", "127.0.0.1:0", "-duration", "12s", "-ttl", "2s"}, args...)...)
	cmd.Env = slices.DeleteFunc(os.Environ(), func(kv string) bool { return strings.HasPrefix(kv, "DATABASE_URL=") })
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	var stderr strings.Builder
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	var (
		mu  sync.Mutex
		out strings.Builder // guarded by mu: what it printed so far
	)
	output := func() string {
		mu.Lock()
		defer mu.Unlock()
		return out.String() + stderr.String()
	}
	serving := make(chan string, 1)
	var reader sync.WaitGroup
	reader.Go(func() { // ends when the example's stdout closes: at its exit, or the cleanup's kill
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			mu.Lock()
			out.WriteString(sc.Text() + "\n")
			mu.Unlock()
			if m := regexp.MustCompile(`^serving (http://\S+)/ `).FindStringSubmatch(sc.Text()); m != nil {
				serving <- m[1]
			}
		}
	})
	exited := make(chan error, 1)
	go func() { // joined below, or by the cleanup
		reader.Wait() // Wait closes stdout: read it whole first
		exited <- cmd.Wait()
	}()
	t.Cleanup(func() { // SIGINT first: the example then stops the server it started
		_ = cmd.Process.Signal(os.Interrupt)
		select {
		case <-exited:
		case <-time.After(30 * time.Second):
			_ = cmd.Process.Kill()
			<-exited
		}
	})

	var base string
	select {
	case base = <-serving:
	case err := <-exited:
		exited <- err
		t.Fatalf("the example exited (%v) before it served its pages:\n%s", err, output())
	case <-time.After(60 * time.Second):
		t.Fatalf("the example did not serve its pages within 60 s:\n%s", output())
	}
	var lastProblem string
	for placed := false; !placed; {
		select {
		case err := <-exited:
			exited <- err
			t.Fatalf("the example exited (%v) before its placement page showed every name placed once; last: %s\n%s", err, lastProblem, output())
		case <-time.After(100 * time.Millisecond):
		}
		lastProblem = placementProblem(base + "/placement")
		placed = lastProblem == ""
	}

	select {
	case err := <-exited:
		exited <- err
		if err != nil {
			t.Fatalf("the example exited with %v:\n%s", err, output())
		}
	case <-time.After(60 * time.Second):
		t.Fatalf("the example did not exit within 60 s of its 12 s:\n%s", output())
	}
	o := output()
	for _, want := range []*regexp.Regexp{
		regexp.MustCompile(`(?m)^ *\S+  the others run r1's \d+ names, `),
		regexp.MustCompile(`(?m)^\d+ starts, 0 while the name ran on another replica; [1-9]\d* fenced writes committed`),
	} {
		if !want.MatchString(o) {
			t.Errorf("the example's output has no line matching %q:\n%s", want, o)
		}
	}
}

// placementProblem fetches the placement page at url as JSON and says
// why it does not show every one of the example's names held by its
// owner, a member, once; "" when it does.
func placementProblem(url string) string {
	req, err := http.NewRequest(http.MethodGet, url, nil)
	if err != nil {
		return err.Error()
	}
	req.Header.Set("Accept", "application/json")
	hc := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
	resp, err := hc.Do(req)
	if err != nil {
		return err.Error()
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return err.Error()
	}
	var page struct {
		Members []struct {
			ID string `json:"id"`
		} `json:"members"`
		Names []struct {
			Name, Owner, Holder string
			Unconfirmed         bool `json:"owner-unconfirmed"`
		} `json:"names"`
	}
	if err := json.Unmarshal(body, &page); err != nil {
		return fmt.Sprintf("status %s, not the page's JSON: %v: %s", resp.Status, err, body)
	}
	members := map[string]bool{}
	for _, m := range page.Members {
		members[m.ID] = true
	}
	seen := map[string]bool{}
	for _, n := range page.Names {
		switch {
		case seen[n.Name]:
			return fmt.Sprintf("%s is shown twice: %s", n.Name, body)
		case n.Holder == "" || n.Holder != n.Owner || n.Unconfirmed || !members[n.Holder]:
			return fmt.Sprintf("%s is not held by its owner, a member: %s", n.Name, body)
		}
		seen[n.Name] = true
	}
	if len(seen) != exampleNames {
		return fmt.Sprintf("%d names shown, want %d: %s", len(seen), exampleNames, body)
	}
	return ""
}
