// The proxy: module versions written in the layout a GOPROXY serves
// (<module>/@v/list, <version>.info, .mod and .zip), so that
// GOPROXY=file://DIR hands them to the go command as a public proxy would.

package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"golang.org/x/mod/modfile"
	"golang.org/x/mod/module"
	"golang.org/x/mod/semver"
	"golang.org/x/mod/zip"
)

// add writes the module in each directory at one version.
func add(args []string) error {
	fs := flag.NewFlagSet("add", flag.ContinueOnError)
	dir := fs.String("proxy", "", "the proxy directory (created if absent)")
	version := fs.String("version", "", "the version to serve the modules at")
	query := fs.String("query", "", "a query (such as main) that also resolves to -version")
	at := fs.String("time", "", "the version's time, RFC 3339; empty: now")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *dir == "" || fs.NArg() == 0 {
		return errors.New("add: want -proxy DIR and at least one module directory")
	}
	if !semver.IsValid(*version) || semver.Canonical(*version) != *version {
		return fmt.Errorf("add: -version %q is not a canonical semantic version", *version)
	}
	// A zero pseudo-version names no commit: no proxy serves one, and
	// writing it here would hide exactly the mistake this checks for.
	if module.IsZeroPseudoVersion(*version) {
		return fmt.Errorf("add: %s names no commit; no proxy serves it", *version)
	}
	when := time.Now().UTC()
	if *at != "" {
		t, err := time.Parse(time.RFC3339, *at)
		if err != nil {
			return fmt.Errorf("add: -time: %w", err)
		}
		when = t.UTC()
	}
	for _, src := range fs.Args() {
		path, err := writeVersion(*dir, src, *version, *query, when)
		if err != nil {
			return fmt.Errorf("add %s: %w", src, err)
		}
		fmt.Printf("proxy: %s@%s from %s\n", path, *version, src)
	}
	return nil
}

// writeVersion writes the module rooted at src (its path read from
// src/go.mod) into the proxy at version, and returns the module path.
func writeVersion(dir, src, version, query string, when time.Time) (string, error) {
	goMod, err := os.ReadFile(filepath.Join(src, "go.mod"))
	if err != nil {
		return "", err
	}
	path := modfile.ModulePath(goMod)
	if path == "" {
		return "", errors.New("go.mod names no module")
	}
	escaped, err := module.EscapePath(path)
	if err != nil {
		return "", err
	}
	at := filepath.Join(dir, filepath.FromSlash(escaped), "@v")
	if err := os.MkdirAll(at, 0o755); err != nil {
		return "", err
	}
	info, err := json.Marshal(struct {
		Version string
		Time    time.Time
	}{version, when})
	if err != nil {
		return "", err
	}
	var zipped bytes.Buffer
	// CreateFromDir leaves out nested modules and VCS directories, as the
	// public proxy does.
	if err := zip.CreateFromDir(&zipped, module.Version{Path: path, Version: version}, src); err != nil {
		return "", err
	}
	files := map[string][]byte{
		version + ".info": info,
		version + ".mod":  goMod,
		version + ".zip":  zipped.Bytes(),
	}
	if query != "" {
		files[query+".info"] = info
	}
	for name, data := range files {
		if err := os.WriteFile(filepath.Join(at, name), data, 0o644); err != nil {
			return "", err
		}
	}
	// @v/list names the tagged versions only; a pseudo-version is reached
	// by a query or by its own name.
	if module.IsPseudoVersion(version) {
		return path, nil
	}
	return path, addToList(filepath.Join(at, "list"), version)
}

// addToList adds version to a proxy's @v/list file, once.
func addToList(list, version string) error {
	old, err := os.ReadFile(list)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	versions := strings.Fields(string(old))
	if !slices.Contains(versions, version) {
		versions = append(versions, version)
	}
	semver.Sort(versions)
	return os.WriteFile(list, []byte(strings.Join(versions, "\n")+"\n"), 0o644)
}
