package runnable_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"
	"testing/synctest"

	"github.com/quiesce-dev/quiesce/runnable"
)

type debugCall struct {
	Name     string `json:"name"`
	Age      string `json:"age"`
	Detached bool   `json:"detached"`
	Where    string `json:"where"`
	Handler  string `json:"handler"`
}

type debugBody struct {
	Draining bool        `json:"draining"`
	Count    int         `json:"count"`
	Calls    []debugCall `json:"calls"`
}

// serve runs a request against r and returns the response; body is decoded on 200.
func serve(t *testing.T, r *runnable.Runnable, method, target string) (*http.Response, debugBody) {
	t.Helper()
	rec := httptest.NewRecorder()
	r.ServeHTTP(rec, httptest.NewRequest(method, target, nil))
	res := rec.Result()
	var body debugBody
	if res.StatusCode == http.StatusOK {
		if ct := res.Header.Get("Content-Type"); ct != "application/json" {
			t.Errorf("Content-Type = %q, want application/json", ct)
		}
		if err := json.NewDecoder(res.Body).Decode(&body); err != nil {
			t.Fatalf("decoding the body: %v", err)
		}
	}
	return res, body
}

func names(calls []debugCall) []string {
	out := make([]string, len(calls))
	for i, c := range calls {
		out[i] = c.Name + " " + c.Age
	}
	return out
}

func TestServeHTTP(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r := runnable.New(runnable.Options{CancelAfter: -1})
		_, body := serve(t, r, http.MethodGet, "/debug/quiesce")
		if body.Draining || body.Count != 0 || body.Calls == nil || len(body.Calls) != 0 {
			t.Fatalf("with nothing pending: %+v, want not draining, count 0 and calls []", body)
		}

		release := make(chan struct{})
		hangAll(t, r, 3, release) // ages 3s, 2s, 1s
		_, body = serve(t, r, http.MethodGet, "/debug/quiesce")
		want := []string{"ctrl/ns/00/hang 3s", "ctrl/ns/01/hang 2s", "ctrl/ns/02/hang 1s"}
		if got := names(body.Calls); body.Draining || body.Count != 3 || !slices.Equal(got, want) {
			t.Fatalf("body = %+v, want not draining, count 3, calls %q oldest first", body, want)
		}
		for _, c := range body.Calls {
			const at = "runnable_test.hangAll.func1 (runnable_test.go:"
			if !c.Detached || !strings.HasPrefix(c.Where, at) || !strings.HasPrefix(c.Handler, at) {
				t.Errorf("call %+v, want detached (started with Go), where and handler in hangAll", c)
			}
		}

		_, body = serve(t, r, http.MethodGet, "/debug/quiesce?limit=2")
		if got := names(body.Calls); body.Count != 3 || !slices.Equal(got, want[:2]) {
			t.Fatalf("?limit=2: %+v, want count 3 and the 2 oldest calls", body)
		}
		_, body = serve(t, r, http.MethodGet, "/debug/quiesce?limit=0")
		if body.Count != 3 || len(body.Calls) != 0 {
			t.Fatalf("?limit=0: %+v, want count 3 and no call", body)
		}
		_, body = serve(t, r, http.MethodGet, "/debug/quiesce?limit=10")
		if len(body.Calls) != 3 {
			t.Fatalf("?limit=10: %+v, want the 3 calls", body)
		}
		_, body = serve(t, r, http.MethodGet, "/debug/quiesce?limit=99999999999999999999999")
		if len(body.Calls) != 3 {
			t.Fatalf("?limit beyond any int: %+v, want all 3 calls", body)
		}

		// Draining shows while the drain waits for the calls.
		drained := make(chan error, 1)
		go func() { drained <- r.Executor().Drain(context.Background()) }()
		synctest.Wait()
		_, body = serve(t, r, http.MethodGet, "/debug/quiesce")
		if !body.Draining || body.Count != 3 {
			t.Fatalf("while draining: %+v, want draining and count 3", body)
		}
		close(release)
		if err := <-drained; err != nil {
			t.Fatal(err)
		}
		_, body = serve(t, r, http.MethodGet, "/debug/quiesce")
		if !body.Draining || body.Count != 0 {
			t.Fatalf("drained: %+v, want draining and count 0", body)
		}
	})
}

func TestServeHTTPBadRequests(t *testing.T) {
	r := runnable.New(runnable.Options{})
	for _, target := range []string{"/?limit=-1", "/?limit=x", "/?limit=", "/?limit=1.5"} {
		if res, _ := serve(t, r, http.MethodGet, target); res.StatusCode != http.StatusBadRequest {
			t.Errorf("GET %s: status %d, want 400", target, res.StatusCode)
		}
	}
	for _, method := range []string{http.MethodPost, http.MethodPut, http.MethodDelete, http.MethodHead} {
		res, _ := serve(t, r, method, "/")
		if res.StatusCode != http.StatusMethodNotAllowed || res.Header.Get("Allow") != http.MethodGet {
			t.Errorf("%s: status %d, Allow %q; want 405 and Allow: GET", method, res.StatusCode, res.Header.Get("Allow"))
		}
	}
}

func TestServeHTTPCutsLongNames(t *testing.T) {
	r := runnable.New(runnable.Options{})
	release := make(chan struct{})
	huge := "line one\n" + strings.Repeat("x", 10<<20)
	if err := r.Executor().Go(context.Background(), huge, func(context.Context) error { <-release; return nil }); err != nil {
		t.Fatal(err)
	}
	_, body := serve(t, r, http.MethodGet, "/debug/quiesce")
	close(release)
	if err := r.Executor().Drain(context.Background()); err != nil {
		t.Fatal(err)
	}
	if len(body.Calls) != 1 {
		t.Fatalf("calls = %d, want 1", len(body.Calls))
	}
	name := body.Calls[0].Name
	if len(name) > 300 || !strings.HasPrefix(name, "line one\n") || !strings.HasSuffix(name, fmt.Sprintf("(%d bytes)", len(huge))) {
		t.Fatalf("name = %.80q... (%d bytes), want it cut to 256 bytes and marked with its length", name, len(name))
	}
}
