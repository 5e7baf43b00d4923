package natsbus

import (
	"encoding/json"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/micro"
	"github.com/nats-io/nuid"

	"github.com/a2a-bus/a2a-bus/internal/version"
	"github.com/a2a-bus/a2a-bus/wire"
)

// ServiceName is the name under which the broker answers the NATS
// service API (ADR-32): `nats micro ls`, `info a2a-bus`, `stats a2a-bus`.
const ServiceName = "a2a-bus"

// service answers the PING, INFO and STATS requests of the NATS service
// API for the broker, with micro's own types and control subjects, and
// counts what the broker serves.
//
// It is not micro.AddService: a micro endpoint is a subscription on one
// connection whose handler micro times as it runs. The broker serves a
// session's requests on that session's own connection, through the fair
// queue, and answers after its handler has returned, so micro would see
// neither most of the requests nor their time. Counting where the broker
// answers keeps the figures true and the subjects of docs/PROTOCOL.md
// unchanged.
type service struct {
	id      string
	started time.Time
	info    micro.Info

	mu        sync.Mutex
	endpoints []micro.EndpointStats
	subs      []*nats.Subscription
}

// maxLastError bounds the last error a stats answer shows: a session
// chooses much of it (a method name, a bad value).
const maxLastError = 256

const (
	endpointSession = iota
	endpointHost
)

func newService(sessionSubject, hostSubject string) *service {
	s := &service{id: nuid.Next(), started: time.Now().UTC()}
	eps := []micro.EndpointInfo{
		{Name: "session", Subject: sessionSubject, Metadata: map[string]string{
			"description": "a session's agent calls (docs/PROTOCOL.md §4); the token in the subject names the session"}},
		{Name: "host", Subject: hostSubject, Metadata: map[string]string{
			"description": "the host's calls: sessions, admin (docs/PROTOCOL.md §2.2, §10)"}},
	}
	s.info = micro.Info{
		ServiceIdentity: s.identity(),
		Type:            micro.InfoResponseType,
		Description:     "a2a-bus: the host-wide A2A broker",
		Endpoints:       eps,
	}
	for _, ep := range eps {
		s.endpoints = append(s.endpoints, micro.EndpointStats{Name: ep.Name, Subject: ep.Subject})
	}
	return s
}

func (s *service) identity() micro.ServiceIdentity {
	return micro.ServiceIdentity{Name: ServiceName, ID: s.id, Version: semver(version.String()),
		Metadata: map[string]string{"protocol": "a2a-bus/1"}}
}

// semver turns a module version ("v1.2.3", "(devel) 0123456789ab") into
// the semantic version the service API asks for.
func semver(v string) string {
	v, rev, _ := strings.Cut(v, " ")
	if strings.HasPrefix(v, "v") && strings.Count(v, ".") >= 2 {
		return strings.TrimPrefix(v, "v")
	}
	if rev != "" {
		return "0.0.0-devel+" + rev
	}
	return "0.0.0-devel"
}

// answer subscribes the control subjects of the three verbs on nc.
func (s *service) answer(nc *nats.Conn) error {
	verbs := map[micro.Verb]func() any{
		micro.PingVerb:  func() any { return micro.Ping{ServiceIdentity: s.identity(), Type: micro.PingResponseType} },
		micro.InfoVerb:  func() any { return s.info },
		micro.StatsVerb: func() any { return s.stats() },
	}
	for verb, value := range verbs {
		for _, kind := range [][2]string{{"", ""}, {ServiceName, ""}, {ServiceName, s.id}} {
			subj, err := micro.ControlSubject(verb, kind[0], kind[1])
			if err != nil {
				return err
			}
			sub, err := nc.Subscribe(subj, func(m *nats.Msg) {
				if m.Reply == "" {
					return
				}
				b, _ := json.Marshal(value())
				m.Respond(b)
			})
			if err != nil {
				return fmt.Errorf("natsbus: subscribe %s: %w", subj, err)
			}
			s.mu.Lock()
			s.subs = append(s.subs, sub)
			s.mu.Unlock()
		}
	}
	return nil
}

// done counts one request of an endpoint: the time from its arrival to
// its answer (a wait in the fair queue included), and the error it was
// answered with, if any. resp nil with problem set is a request refused
// without an answer.
func (s *service) done(endpoint int, took time.Duration, resp []byte, problem string) {
	if problem == "" && resp != nil {
		if e := wire.ResponseError(resp); e != nil {
			problem = fmt.Sprintf("%d %s", e.Code, e.Message)
		}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	st := &s.endpoints[endpoint]
	st.NumRequests++
	st.ProcessingTime += took
	st.AverageProcessingTime = st.ProcessingTime / time.Duration(st.NumRequests)
	if problem != "" {
		st.NumErrors++
		st.LastError = wire.Cut(problem, maxLastError)
	}
}

func (s *service) stats() micro.Stats {
	s.mu.Lock()
	defer s.mu.Unlock()
	st := micro.Stats{ServiceIdentity: s.identity(), Type: micro.StatsResponseType, Started: s.started}
	for _, ep := range s.endpoints {
		st.Endpoints = append(st.Endpoints, &ep) // a copy: ep is per iteration
	}
	return st
}

// stop unsubscribes the control subjects.
func (s *service) stop() {
	s.mu.Lock()
	subs := s.subs
	s.subs = nil
	s.mu.Unlock()
	for _, sub := range subs {
		sub.Unsubscribe()
	}
}
