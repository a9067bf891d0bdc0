// The group's placement over HTTP, who runs what, in the core's three
// forms: JSON, text and an HTML page.

package ha

import (
	"cmp"
	_ "embed"
	"encoding/json"
	"fmt"
	"html/template"
	"io"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"
	"unicode"

	"github.com/bgctl/controller"
)

// StatusHandler returns an [http.Handler] serving the placement of r's
// group as r sees it ([Replica.GroupStatus]), from any replica: every name
// registered on r with its owner, the holder of its claim and since when,
// and every member with its lease; a name without a holder, held by a
// member that does not own it, or owned by a member not known to register
// it ([NameStatus.OwnerUnconfirmed]), is marked. It answers GET and HEAD in the
// three formats of [controller.StatusHandler], chosen the same way
// ([controller.NegotiateFormat]):
//
//   - json: the [Status], its durations strings such as "1.5s";
//   - text: for curl, a table of the members, then one of the names,
//     the marked ones first;
//   - html: a page for a browser, server-rendered without script: a
//     summary, then the same two tables.
//
// With marked=1, text and html list only the marked names. The members'
// lease TTLs come from etcd, asked within the request's context; a member
// whose lease etcd did not tell is shown without one, and text and html
// say why.
func StatusHandler(r *Replica) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		format, ok := controller.NegotiateFormat(w, req)
		if !ok {
			return
		}
		st, stErr := r.GroupStatus(req.Context())
		markedOnly, _ := strconv.ParseBool(req.URL.Query().Get("marked"))
		w.Header().Set("Cache-Control", "no-store")
		w.Header().Add("Vary", "Accept")
		var err error
		switch format {
		case "json":
			w.Header().Set("Content-Type", "application/json")
			err = json.NewEncoder(w).Encode(st)
		case "text":
			w.Header().Set("Content-Type", "text/plain; charset=utf-8")
			err = newPlacementPage(st, stErr, markedOnly, time.Now()).writeText(w)
		default:
			w.Header().Set("Content-Type", "text/html; charset=utf-8")
			err = placementTemplate.Execute(w, newPlacementPage(st, stErr, markedOnly, time.Now()))
		}
		_ = err // the client went away; nothing to tell it
	})
}

// placementPage is what the text and the HTML page show.
type placementPage struct {
	Prefix, ID, Mode, Lease, Fence, Now, Error string
	Members, Total, Held, Unheld, Misplaced    int
	Unconfirmed                                int // names whose owner is not known to register them
	MarkedOnly                                 bool
	Shown                                      int
	MemberRows                                 []memberRow
	NameRows                                   []nameRow
}

// memberRow is one member in the page; empty cells are unknown.
type memberRow struct {
	Class, Self, ID, Lease, TTL, Renewed, Fence, Revision string
}

// nameRow is one name in the page; empty cells are unknown or absent.
type nameRow struct {
	Class, Mark                                string // Class: Mark for the style sheet
	Name, Owner, Holder, Since, Revision, Here string
	rank                                       int // 0 owner not known to register it, 1 no holder, 2 held by a non-owner, 3 ok: the order of the rows
}

func newPlacementPage(st Status, stErr error, markedOnly bool, now time.Time) *placementPage {
	p := &placementPage{Prefix: st.Prefix, ID: st.ID, Mode: st.Mode, Lease: st.Lease, Now: now.UTC().Format(time.RFC3339),
		Members: len(st.Members), Total: len(st.Names), MarkedOnly: markedOnly}
	if st.Lease != "" {
		p.Fence = st.Fence.String()
	}
	if stErr != nil {
		p.Error = stErr.Error()
	}
	for _, m := range st.Members {
		row := memberRow{Class: "member", ID: m.ID, Lease: m.Lease, Revision: strconv.FormatInt(m.Revision, 10)}
		if m.TTL != nil {
			row.TTL = m.TTL.String()
		}
		if m.Renewed != nil {
			row.Renewed = m.Renewed.String() + " ago"
		}
		if m.NotRenewing {
			row.Class, row.Renewed = "stale", row.Renewed+", not renewing"
		}
		if m.ID == st.ID {
			row.Class, row.Self, row.Fence = "self", "this replica", p.Fence
		}
		p.MemberRows = append(p.MemberRows, row)
	}
	for _, ns := range st.Names {
		row := nameRow{Name: ns.Name, Owner: ns.Owner, Holder: ns.Holder, Here: ns.State}
		switch {
		case ns.OwnerUnconfirmed:
			// First: the name may run nowhere, and nothing else tells.
			row.Class, row.Mark, row.rank = "unconfirmed", "owner may not register it", 0
			p.Unconfirmed++
		case ns.Holder == "":
			row.Class, row.Mark, row.rank = "unheld", "no holder", 1
			p.Unheld++
		case ns.Holder != ns.Owner:
			row.Class, row.Mark, row.rank = "misplaced", "held by a non-owner", 2
			p.Misplaced++
		default:
			row.Class, row.Mark, row.rank = "ok", "ok", 3
			p.Held++
		}
		if ns.Since != nil {
			row.Since = max(now.Sub(*ns.Since).Round(time.Second), 0).String() + " ago"
		}
		if ns.Revision != 0 {
			row.Revision = strconv.FormatInt(ns.Revision, 10)
		}
		if !markedOnly || row.rank < 3 {
			p.NameRows = append(p.NameRows, row)
		}
	}
	slices.SortStableFunc(p.NameRows, func(a, b nameRow) int { return cmp.Compare(a.rank, b.rank) })
	p.Shown = len(p.NameRows)
	return p
}

// writeText writes the page as text:
//
//	Replicas of /svc, seen from r0 (spread, lease 694d7f3b2a1c8d04, fence 1.4s) at 2026-01-02T15:04:05Z
//
//	Members: 2
//	Member   Lease              Lease TTL   Renewed     Fence   Key revision
//	r0 *     694d7f3b2a1c8d04   2s          -           1.4s    5
//	r1       694d7f3b2a1c8d09   2s          0s ago      -       7
//
//	Names: 1 held by their owner, 1 without a holder, 0 held by a non-owner
//	Mark        Name     Owner   Holder   Held since   Claim revision   Here
//	no holder   job-01   r1      -        -            -                -
//	ok          job-00   r0      r0       5s ago       12               running
//
// Unknown and absent cells are "-"; the star marks the replica serving it.
func (p *placementPage) writeText(w io.Writer) error {
	lease := "no lease: joining again"
	if p.Lease != "" {
		lease = "lease " + p.Lease + ", fence " + p.Fence
	}
	fmt.Fprintf(w, "Replicas of %s, seen from %s (%s, %s) at %s\n", cell(p.Prefix), cell(p.ID), p.Mode, lease, p.Now)
	if p.Error != "" {
		fmt.Fprintf(w, "Error: %s\n", cell(p.Error))
	}
	fmt.Fprintf(w, "\nMembers: %d\n", p.Members)
	tw := tabwriter.NewWriter(w, 0, 8, 3, ' ', 0)
	fmt.Fprintln(tw, "Member\tLease\tLease TTL\tRenewed\tFence\tKey revision")
	for _, m := range p.MemberRows {
		id := cell(m.ID)
		if m.Self != "" {
			id += " *"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\n", id, cell(m.Lease), cell(m.TTL), cell(m.Renewed), cell(m.Fence), cell(m.Revision))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	fmt.Fprintf(w, "\nNames: %d held by their owner, %d without a holder, %d held by a non-owner", p.Held, p.Unheld, p.Misplaced)
	if p.Unconfirmed > 0 {
		fmt.Fprintf(w, ", %d whose owner may not register them", p.Unconfirmed)
	}
	fmt.Fprintln(w)
	if p.MarkedOnly {
		fmt.Fprintf(w, "Showing the %d marked\n", p.Shown)
	}
	fmt.Fprintln(tw, "Mark\tName\tOwner\tHolder\tHeld since\tClaim revision\tHere")
	for _, n := range p.NameRows {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\n", n.Mark, cell(n.Name), cell(n.Owner), cell(n.Holder), cell(n.Since), cell(n.Revision), cell(n.Here))
	}
	return tw.Flush()
}

// cell returns s fit for one cell of a text table: "-" when empty, every
// control character a space, so that neither a line break nor a tab can
// split a row.
func cell(s string) string {
	if s == "" {
		return "-"
	}
	return strings.Map(func(r rune) rune {
		if unicode.IsControl(r) {
			return ' '
		}
		return r
	}, s)
}

// placementTemplate is well-formed XHTML as well as HTML, so that a test
// can read it with encoding/xml.
//
//go:embed placement.html
var placementText string

var placementTemplate = template.Must(template.New("placement").Parse(placementText))
