package controller_test

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
)

// configStore is the suite's config store: it keeps the data of each PUT /<namespace>/<name>.
// A PUT of a name starting with "slow" is held until release is called (or the request
// ends), the time a slow store takes to answer.
type configStore struct {
	*httptest.Server
	released chan struct{}
	once     sync.Once

	mu   sync.Mutex
	data map[string]map[string]string // by "<namespace>/<name>"
}

func newConfigStore() *configStore {
	s := &configStore{released: make(chan struct{}), data: map[string]map[string]string{}}
	s.Server = httptest.NewServer(http.HandlerFunc(s.put))
	return s
}

func (s *configStore) put(w http.ResponseWriter, r *http.Request) {
	key := strings.TrimPrefix(r.URL.Path, "/")
	if r.Method != http.MethodPut || strings.Count(key, "/") != 1 {
		http.Error(w, "want PUT /<namespace>/<name>", http.StatusBadRequest)
		return
	}
	var data map[string]string
	if err := json.NewDecoder(r.Body).Decode(&data); err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	if _, name, _ := strings.Cut(key, "/"); strings.HasPrefix(name, "slow") {
		select {
		case <-s.released:
		case <-r.Context().Done():
			return
		}
	}
	s.mu.Lock()
	s.data[key] = data
	s.mu.Unlock()
	w.WriteHeader(http.StatusNoContent)
}

// stored returns the data stored for namespace/name, nil if none.
func (s *configStore) stored(key string) map[string]string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.data[key]
}

// release lets the held PUTs, and every later one, answer.
func (s *configStore) release() { s.once.Do(func() { close(s.released) }) }
