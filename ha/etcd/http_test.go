// Tests of the placement handler: its three forms, read as a browser and
// a program would, from a group in which one name has no holder and one
// is held by a non-owner.

package etcd

import (
	"context"
	"encoding/json"
	"encoding/xml"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/bgctl/controller/ha"
	"github.com/bgctl/controller/ha/internal/place"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// get sends a request to h and returns the response and its body.
func get(t *testing.T, h http.Handler, method, target, accept string) (*http.Response, string) {
	t.Helper()
	req := httptest.NewRequest(method, target, nil)
	if accept != "" {
		req.Header.Set("Accept", accept)
	}
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	b, err := io.ReadAll(rec.Result().Body)
	if err != nil {
		t.Fatal(err)
	}
	return rec.Result(), string(b)
}

// pageTable is a table of a page as a browser shows it: the class and the
// cells' text of each body row.
type pageTable struct {
	classes []string
	rows    [][]string
}

func (tb *pageTable) column(i int) []string {
	var out []string
	for _, r := range tb.rows {
		out = append(out, r[i])
	}
	return out
}

// readPage reads a page as XML (it is well-formed XHTML) and returns its
// tables by id and the text of the paragraphs by id.
func readPage(t *testing.T, page string) (tables map[string]*pageTable, paras map[string]string) {
	t.Helper()
	d := xml.NewDecoder(strings.NewReader(page))
	d.Entity = xml.HTMLEntity
	tables, paras = map[string]*pageTable{}, map[string]string{}
	var table *pageTable
	var inBody, inCell bool
	var para string
	var cell strings.Builder
	attr := func(se xml.StartElement, name string) string {
		for _, a := range se.Attr {
			if a.Name.Local == name {
				return a.Value
			}
		}
		return ""
	}
	for {
		tok, err := d.Token()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatalf("the page is not well-formed: %v\n%s", err, page)
		}
		switch tok := tok.(type) {
		case xml.StartElement:
			switch tok.Name.Local {
			case "table":
				table = &pageTable{}
				tables[attr(tok, "id")] = table
			case "tbody":
				inBody = true
			case "tr":
				if inBody {
					table.classes = append(table.classes, attr(tok, "class"))
					table.rows = append(table.rows, nil)
				}
			case "td":
				inCell = inBody
				cell.Reset()
			case "p":
				para = attr(tok, "id")
			}
		case xml.EndElement:
			switch tok.Name.Local {
			case "tbody":
				inBody = false
			case "td":
				if inCell {
					last := &table.rows[len(table.rows)-1]
					*last = append(*last, cell.String())
				}
				inCell = false
			case "p":
				if para != "" {
					paras[para] = strings.Join(strings.Fields(paras[para]), " ")
				}
				para = ""
			}
		case xml.CharData:
			if inCell {
				cell.Write(tok)
			}
			if para != "" {
				paras[para] += string(tok)
			}
		}
	}
	return tables, paras
}

// A group of two replicas in which "alone" is registered on r0 only, and
// r1's set of names, published since their names differ, is deleted
// behind its back: r1 then counts as registering every name, owns "alone"
// by hashing and is not known to register it (no holder, owner
// unconfirmed); "taken" is claimed under a lease of no member (held by a
// non-owner): the page served by r0 shows every name and member, marks
// those two, and reads the same in all three forms.
func TestPlacementHandler(t *testing.T) {
	c := newCluster(t, 6, testOptions())
	cli := newClient(t, testEtcd)
	defer cli.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	intruder, err := cli.Grant(ctx, 60)
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Revoke(context.Background(), intruder.ID)
	if _, err := cli.Put(ctx, c.prefix+"/claims/taken", "intruder", clientv3.WithLease(intruder.ID)); err != nil {
		t.Fatal(err)
	}
	r0, r1 := c.joinEmpty("r0"), c.joinEmpty("r1")
	alone := ""
	for i := 0; alone == ""; i++ {
		if name := "alone-" + string(rune('a'+i)); place.Owner(name, []string{"r0", "r1"}) == "r1" {
			alone = name
		}
	}
	waitFor(t, "each replica to see both", func() bool { return len(r0.r.Status().Members) == 2 && len(r1.r.Status().Members) == 2 })
	c.names = append(c.names, "taken")
	c.register(r0)
	c.register(r1)
	if err := r0.r.UpdateController(alone, c.rec.Params("r0", alone)); err != nil {
		t.Fatal(err)
	}
	want := c.expected([]string{"r0", "r1"})
	delete(want, "taken")
	want[alone] = "r0" // the only member registering it
	c.waitPlacement(want, 10*time.Second)
	delete(want, alone)
	if _, err := cli.Delete(ctx, keysOf(c.prefix).names+"r1/", clientv3.WithPrefix()); err != nil {
		t.Fatal(err)
	}
	// r0's view settles after the placement: a claim another replica
	// released shows under it until the watch brings the deletion.
	waitFor(t, "r0's view to settle", func() bool {
		for _, ns := range r0.r.Status().Names {
			switch ns.Name {
			case alone:
				if ns.Holder != "" || ns.State != "" {
					return false
				}
			case "taken":
			default:
				if ns.Holder != want[ns.Name] || (ns.State == "running") != (ns.Holder == "r0") || ns.State == "releasing" {
					return false
				}
			}
		}
		return true
	})

	h := ha.StatusHandler(r0.r)
	resp, body := get(t, h, http.MethodGet, "/placement", "application/json")
	if ct := resp.Header.Get("Content-Type"); ct != "application/json" {
		t.Fatalf("Content-Type %q for Accept: application/json", ct)
	}
	var raw struct {
		Fence   string `json:"fence"`
		Members []struct {
			ID, Lease, TTL string
		} `json:"members"`
	}
	if err := json.Unmarshal([]byte(body), &raw); err != nil {
		t.Fatalf("JSON: %v\n%s", err, body)
	}
	if d, err := time.ParseDuration(raw.Fence); err != nil || d <= 0 || d > c.opts.TTL || d != d.Round(time.Millisecond) {
		t.Errorf("fence %q in the JSON: want a duration string within TTL, to the millisecond", raw.Fence)
	}
	if len(raw.Members) != 2 || raw.Members[0].ID != "r0" || raw.Members[1].ID != "r1" {
		t.Fatalf("members in the JSON: %+v", raw.Members)
	}
	for _, m := range raw.Members {
		if d, err := time.ParseDuration(m.TTL); err != nil || d <= 0 || d > c.opts.TTL || m.Lease == "" {
			t.Errorf("member %s in the JSON: lease %q, TTL %q; want a lease and a TTL string within TTL", m.ID, m.Lease, m.TTL)
		}
	}
	var st ha.Status
	if err := json.Unmarshal([]byte(body), &st); err != nil {
		t.Fatal(err)
	}
	if st.Prefix != c.prefix || st.ID != "r0" || len(st.Names) != len(c.names)+1 {
		t.Errorf("status: prefix %q, ID %q, %d names; want %q, r0, %d", st.Prefix, st.ID, len(st.Names), c.prefix, len(c.names)+1)
	}
	for _, ns := range st.Names {
		switch {
		case ns.Name == alone && ns.Holder == "" && ns.Owner == "r1" && ns.OwnerUnconfirmed:
		case ns.Name == "taken" && ns.Holder == "intruder" && ns.Since == nil && ns.Revision > 0:
			// created before r0 listed the prefix: its age is unknown
		case ns.Name != alone && ns.Name != "taken" && ns.Holder == want[ns.Name] && ns.Owner == want[ns.Name] && ns.Since != nil && ns.Revision > 0:
		default:
			t.Errorf("name in the JSON: %+v (owner by hashing %s)", ns, want[ns.Name])
		}
	}

	resp, page := get(t, h, http.MethodGet, "/placement", "text/html,application/xhtml+xml,application/xml;q=0.9,*/*;q=0.8")
	if ct := resp.Header.Get("Content-Type"); ct != "text/html; charset=utf-8" {
		t.Fatalf("Content-Type %q for a browser's Accept", ct)
	}
	tables, paras := readPage(t, page)
	// Every name r1 owns is marked: r0 no longer knows that r1 registers
	// it.
	onR0, onR1 := len(place.On(want, "r0")), len(place.On(want, "r1"))
	summary := fmt.Sprintf("%d held by their owner, 0 without a holder, 1 held by a non-owner, %d whose owner may not register them", onR0, onR1+1)
	if !strings.HasPrefix(paras["summary"], "2 members, 8 names: "+summary+". Seen from r0 (spread, lease ") {
		t.Errorf("summary: %q", paras["summary"])
	}
	members, names := tables["members"], tables["names"]
	if members == nil || names == nil {
		t.Fatalf("tables %v in the page:\n%s", tables, page)
	}
	if got := members.column(1); !slices.Equal(got, []string{"r0", "r1"}) {
		t.Errorf("members %q", got)
	}
	if members.classes[0] != "self" || members.rows[0][0] != "this replica" || members.rows[0][5] == "" || members.rows[1][5] != "" {
		t.Errorf("member rows %q %q: r0 marked as the serving replica, with its fence alone", members.classes, members.rows)
	}
	if members.rows[0][4] != "" || !strings.HasSuffix(members.rows[1][4], "s ago") || members.classes[1] != "member" {
		t.Errorf("member rows %q %q: r1 renewed some seconds ago, and renewing; r0's own renewal not shown", members.classes, members.rows)
	}
	marked := append(append([]string{alone}, place.On(want, "r1")...), "taken")
	if got := names.column(1)[:len(marked)]; !slices.Equal(got, marked) {
		t.Errorf("names %q: the marked ones first, %q", names.column(1), marked)
	}
	for i, class := range names.classes {
		if want := map[bool]string{true: "unconfirmed", false: "ok"}[i <= onR1]; i != onR1+1 && class != want {
			t.Errorf("row %d's class %q, want %q", i, class, want)
		}
	}
	if got := names.rows[onR1+1]; got[0] != "held by a non-owner" || got[3] != "intruder" || names.classes[onR1+1] != "misplaced" {
		t.Errorf("the taken name's row: %q", got)
	}
	for _, row := range slices.Concat(names.rows[1:onR1+1], names.rows[onR1+2:]) {
		if !strings.HasSuffix(row[4], "s ago") || row[5] == "" || (row[3] == "r0") != (row[6] == "running") {
			t.Errorf("a held name's row: %q; want since when, the revision, and running here when r0 holds it", row)
		}
	}
	if strings.Contains(page, "<script") {
		t.Error("the page has a script")
	}
	tables, _ = readPage(t, func() string { _, b := get(t, h, http.MethodGet, "/placement?format=html&marked=1", ""); return b }())
	if got := tables["names"].column(1); !slices.Equal(got, marked) {
		t.Errorf("marked=1 shows %q", got)
	}

	resp, text := get(t, h, http.MethodGet, "/placement", "")
	if ct := resp.Header.Get("Content-Type"); ct != "text/plain; charset=utf-8" {
		t.Fatalf("Content-Type %q without Accept", ct)
	}
	for _, want := range []string{"Members: 2\n", "Names: " + summary + "\n", "\nowner may not register it   " + alone + " "} {
		if !strings.Contains(text, want) {
			t.Errorf("text has no %q:\n%s", want, text)
		}
	}

	if resp, _ := get(t, h, http.MethodGet, "/placement?format=xml", ""); resp.StatusCode != http.StatusBadRequest {
		t.Errorf("format=xml: %d, want 400", resp.StatusCode)
	}
	if resp, _ := get(t, h, http.MethodPost, "/placement", ""); resp.StatusCode != http.StatusMethodNotAllowed {
		t.Errorf("POST: %d, want 405", resp.StatusCode)
	}
	c.rec.AssertNoOverlap(t)
}
