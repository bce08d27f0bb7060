package main

import (
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"strconv"
	"strings"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/redis/go-redis/v9"
	"github.com/spf13/pflag"
)

// brokerKind is a family of brokers the relay publishes to; its string is
// the value of the broker label of the relay metrics.
type brokerKind string

// The brokers --broker can name.
const (
	brokerKafka    brokerKind = "kafka"
	brokerNATS     brokerKind = "nats"
	brokerRabbitMQ brokerKind = "rabbitmq"
	brokerRedis    brokerKind = "redis"
)

// title is the broker's name in messages.
func (k brokerKind) title() string {
	switch k {
	case brokerNATS:
		return "NATS"
	case brokerRabbitMQ:
		return "RabbitMQ"
	case brokerRedis:
		return "Redis"
	default:
		return "Kafka"
	}
}

// Environment variables read without a flag.
const (
	// envBroker is --broker's variable: the one place a URL holding a
	// password is accepted.
	envBroker = "OUTBOX_BROKER"
	// envBrokerPassword is the broker password, the alternative to
	// --broker-password-file.
	envBrokerPassword = "OUTBOX_BROKER_PASSWORD"
)

// brokerFlags are the relay's broker choice and its non-Kafka settings.
type brokerFlags struct {
	url          string
	passwordFile string
	exchange     string
	natsCreds    string
	natsNKey     string
	natsStream   string
}

// hideFlags hides the named flags of fs from its help: a provisioning
// command for one broker shares brokerFlags with the relay and does not
// list the other brokers' flags (they still parse, and are ignored).
func hideFlags(fs *pflag.FlagSet, names ...string) {
	for _, n := range names {
		_ = fs.MarkHidden(n)
	}
}

// register declares the broker flags on fs.
func (b *brokerFlags) register(fs *pflag.FlagSet) {
	fs.StringVar(&b.url, "broker", "", "the broker, by URL: kafka://host:9092[,host2:9092], nats://host:4222[,host2:4222] or tls://... (NATS over TLS), amqp://user@host:5672/vhost or amqps://..., redis://user@host:6379/0 or rediss://...; a password in it only through "+envBroker+", never the flag")
	envFlag(fs, "broker", envBroker)
	fs.StringVar(&b.passwordFile, "broker-password-file", "", "file holding the password of the --broker URL's user (NATS without a user: its token; one trailing newline is ignored); or set "+envBrokerPassword)
	envFlag(fs, "broker-password-file", "OUTBOX_BROKER_PASSWORD_FILE")
	fs.StringVar(&b.exchange, "exchange", "", "RabbitMQ: the exchange messages without a topic go to (default outbox.event, rabbitmq.DefaultExchange); it must exist")
	envFlag(fs, "exchange", "OUTBOX_EXCHANGE")
	fs.StringVar(&b.natsCreds, "nats-creds-file", "", "NATS: a credentials file (JWT and nkey seed, nats.UserCredentials)")
	envFlag(fs, "nats-creds-file", "OUTBOX_NATS_CREDS_FILE")
	fs.StringVar(&b.natsNKey, "nats-nkey-file", "", "NATS: a file holding a user nkey seed (nats.NkeyOptionFromSeed)")
	envFlag(fs, "nats-nkey-file", "OUTBOX_NATS_NKEY_FILE")
	fs.StringVar(&b.natsStream, "nats-stream", "", "NATS: the stream the events are stored in (outbox nats stream create makes one); checked at start and by /readyz, which then fail naming the command that creates it")
	envFlag(fs, "nats-stream", "OUTBOX_NATS_STREAM")
}

// brokerURL is a parsed --broker URL.
type brokerURL struct {
	kind   brokerKind
	scheme string
	// raw is the URL as given; it may hold a password: never show it.
	raw string
	// redacted is raw with any password or token replaced by xxxxx.
	redacted string
	// tls: the scheme implies TLS (amqps, rediss, tls).
	tls bool
	// hosts are the servers, host:port (Kafka, NATS: every one; RabbitMQ,
	// Redis: the one).
	hosts []string
	// user and password are the userinfo's, unescaped; hasPassword tells
	// an empty password from none. A NATS URL's user without a password
	// is a token (nats.go's rule).
	user        string
	password    string
	hasPassword bool
	// secretParam: a password= query parameter (go-redis reads none, but
	// it is refused on argv all the same).
	secretParam bool
	// redis holds the parsed options of a Redis URL.
	redis *redis.Options
	// dialTimeout is the URL's own connect timeout (RabbitMQ's
	// connection_timeout, Redis's dial_timeout); 0 if it sets none.
	dialTimeout time.Duration
}

// hasSecret reports whether the URL itself carries a credential: a
// password, a password parameter or a NATS token (a user without a
// password, unless separate is set: the password is given separately, so
// the user is a user).
func (b *brokerURL) hasSecret(separate bool) bool {
	return b.hasPassword || b.secretParam || (b.kind == brokerNATS && b.user != "" && !separate)
}

// brokerSchemes maps a --broker scheme to its broker and whether it implies TLS.
var brokerSchemes = map[string]struct {
	kind brokerKind
	tls  bool
}{
	"kafka": {brokerKafka, false},
	"nats":  {brokerNATS, false}, "tls": {brokerNATS, true},
	"amqp": {brokerRabbitMQ, false}, "amqps": {brokerRabbitMQ, true},
	"redis": {brokerRedis, false}, "rediss": {brokerRedis, true},
}

// Default ports of the brokers whose URL may omit them.
const (
	defaultKafkaPort = "9092"
	defaultNATSPort  = "4222"
)

// splitUserinfo splits the part of a URL after "://" into its userinfo
// (without the '@'; ok false if none) and the rest. The userinfo ends at
// the last '@' before the path; if there is none there, at the last '@' at
// all (a password holding an unescaped '/' or '?'), erring towards
// treating more as secret.
func splitUserinfo(rest string) (userinfo, after string, ok bool) {
	auth := rest
	if i := strings.IndexAny(rest, "/?#"); i >= 0 {
		auth = rest[:i]
	}
	at := strings.LastIndexByte(auth, '@')
	if at < 0 {
		at = strings.LastIndexByte(rest, '@')
	}
	if at < 0 {
		return "", rest, false
	}
	return rest[:at], rest[at+1:], true
}

// redactBrokerURL returns raw with the userinfo's password replaced by
// xxxxx, a NATS token (a user without a password in a nats:// or tls://
// URL) too, and password= parameters. It never fails: an unparsable URL
// is redacted all the same.
func redactBrokerURL(raw string) string { return redactURL(raw, true) }

// redactURL is redactBrokerURL; natsToken false keeps a NATS user without
// a password (its password is given separately: it is no token).
func redactURL(raw string, natsToken bool) string {
	scheme, rest, ok := strings.Cut(raw, "://")
	if !ok {
		return passwordParam.ReplaceAllString(raw, "${1}="+redacted)
	}
	if ui, after, ok := splitUserinfo(rest); ok {
		user, _, hasPass := strings.Cut(ui, ":")
		switch {
		case hasPass:
			rest = user + ":" + redacted + "@" + after
		case natsToken && user != "" && brokerSchemes[strings.ToLower(scheme)].kind == brokerNATS:
			rest = redacted + "@" + after
		}
	}
	return scheme + "://" + passwordParam.ReplaceAllString(rest, "${1}="+redacted)
}

// brokerSecrets returns the credentials in raw (password, NATS token,
// password parameters), escaped as written and unescaped, so that they
// can be scrubbed from any message.
func brokerSecrets(raw string) []string { return urlSecrets(raw, true) }

// urlSecrets is brokerSecrets; natsToken false leaves out a NATS user
// without a password.
func urlSecrets(raw string, natsToken bool) []string {
	var out []string
	add := func(s string) {
		out = append(out, s)
		if u, err := url.PathUnescape(s); err == nil && u != s {
			out = append(out, u)
		}
		// The pieces between unescaped delimiters too: url.Parse cuts
		// such a password and its errors (or the client's) quote a
		// piece ("invalid port \":s3cr3t\" after host").
		if pieces := strings.FieldsFunc(s, func(r rune) bool { return strings.ContainsRune("/?#:@", r) }); len(pieces) > 1 {
			out = append(out, pieces...)
		}
	}
	scheme, rest, ok := strings.Cut(raw, "://")
	if ok {
		if ui, _, ok := splitUserinfo(rest); ok {
			user, pass, hasPass := strings.Cut(ui, ":")
			switch {
			case hasPass:
				add(pass)
			case natsToken && user != "" && brokerSchemes[strings.ToLower(scheme)].kind == brokerNATS:
				add(user)
			}
		}
	}
	for _, m := range passwordParam.FindAllStringSubmatch(raw, -1) {
		add(m[2])
	}
	return out
}

// parseBrokerURL parses a --broker URL. Every error is a usage error that
// shows the URL redacted.
func parseBrokerURL(raw string) (*brokerURL, error) {
	shown := redactBrokerURL(raw)
	scheme, rest, ok := strings.Cut(strings.TrimSpace(raw), "://")
	if !ok || scheme == "" {
		return nil, usageErrorf("cannot tell the broker from --broker %s: want kafka://, nats://, tls://, amqp://, amqps://, redis:// or rediss://", shown)
	}
	scheme = strings.ToLower(scheme)
	s, known := brokerSchemes[scheme]
	if !known {
		return nil, usageErrorf("unknown broker scheme %q in --broker %s: want kafka://, nats://, tls:// (NATS over TLS), amqp://, amqps://, redis:// or rediss://", scheme, shown)
	}
	b := &brokerURL{kind: s.kind, scheme: scheme, raw: raw, redacted: shown, tls: s.tls, secretParam: passwordParam.MatchString(raw)}
	bad := func(format string, args ...any) error {
		return usageErrorf("malformed --broker %s: %s", shown, scrub(fmt.Sprintf(format, args...), brokerSecrets(raw)))
	}
	ui, after, hasUI := splitUserinfo(rest)
	if hasUI && s.kind == brokerNATS && strings.Contains(ui, ",") {
		// The userinfo spans servers of the list: credentials written
		// after the first server ("nats://n1,nats://tok@n2",
		// "u:p@n1,u:p@n2") would drop the servers before them. An
		// unescaped ',' is no password character in a server list.
		return nil, bad("credentials go once, before the first server (%s://user:password@host1,host2), not after one; escape a ',' in a password as %%2C", scheme)
	}
	if hasUI {
		user, pass, hasPass := strings.Cut(ui, ":")
		var err error
		if b.user, err = url.PathUnescape(user); err != nil {
			return nil, bad("bad escape in the user name")
		}
		if b.password, err = url.PathUnescape(pass); err != nil {
			return nil, bad("bad escape in the password")
		}
		b.hasPassword = hasPass
	}
	switch s.kind {
	case brokerKafka, brokerNATS:
		if hasUI && s.kind == brokerKafka {
			return nil, usageErrorf("--broker %s: a kafka:// URL takes no user or password: use --sasl-mechanism, --sasl-user and --sasl-password-file or %s", shown, envSASLPassword)
		}
		port := defaultKafkaPort
		if s.kind == brokerNATS {
			port = defaultNATSPort
		}
		for _, h := range strings.Split(after, ",") {
			h = strings.TrimSpace(h)
			if p, r, ok := strings.Cut(h, "://"); ok { // nats://a:4222,nats://b:4222
				if brokerSchemes[strings.ToLower(p)].kind != s.kind {
					return nil, bad("server %q is not a %s server", h, s.kind.title())
				}
				if strings.ToLower(p) != scheme {
					// Every server is dialled with the first one's scheme.
					return nil, bad("server %q: give every server the same scheme (%s://), TLS or not", h, scheme)
				}
				h = r
			}
			if i := strings.IndexAny(h, "/?#"); i >= 0 {
				if strings.Trim(h[i:], "/") != "" {
					return nil, bad("a %s:// URL has no path or parameters", scheme)
				}
				h = h[:i]
			}
			if h == "" {
				continue
			}
			host, p, err := net.SplitHostPort(h)
			if err != nil {
				host, p = strings.Trim(h, "[]"), port
				if strings.Contains(host, ":") && !strings.Contains(h, "[") {
					return nil, bad("server %q: %v", h, err)
				}
			}
			if n, err := strconv.Atoi(p); err != nil || n < 1 || n > 65535 {
				return nil, bad("server %q: invalid port %q", h, p)
			}
			if host == "" {
				return nil, bad("server %q names no host", h)
			}
			b.hosts = append(b.hosts, net.JoinHostPort(host, p))
		}
		if len(b.hosts) == 0 {
			return nil, bad("no server")
		}
	case brokerRabbitMQ, brokerRedis:
		if strings.Contains(after, ",") {
			if i := strings.IndexAny(after, "/?#"); i < 0 || strings.Contains(after[:i], ",") {
				return nil, bad("%s takes one host, not a list", s.kind.title())
			}
		}
	}
	switch s.kind {
	case brokerRabbitMQ:
		uri, err := amqp.ParseURI(raw)
		if err != nil {
			return nil, bad("%v", urlErrorCause(err))
		}
		if u, err := url.Parse(raw); err != nil || u.Hostname() == "" {
			return nil, bad("no host")
		} else if err := sameUserinfo(u, b, hasUI); err != nil {
			return nil, bad("%v", err)
		}
		if uri.CACertFile != "" || uri.CertFile != "" || uri.KeyFile != "" || uri.ServerName != "" {
			// The relay's TLS configuration comes from the flags alone
			// (amqp091-go reads these only without one).
			return nil, bad("the URL's cacertfile, certfile, keyfile and server_name_indication are not read: use --tls-ca-file, --tls-cert-file, --tls-key-file and --tls-server-name")
		}
		b.hosts = []string{net.JoinHostPort(uri.Host, strconv.Itoa(uri.Port))}
		b.dialTimeout = time.Duration(uri.ConnectionTimeout) * time.Millisecond // amqp091-go: milliseconds
	case brokerRedis:
		o, err := redis.ParseURL(raw)
		if err != nil {
			return nil, bad("%v", urlErrorCause(err))
		}
		host, _, _ := net.SplitHostPort(o.Addr)
		u, err := url.Parse(raw)
		if err != nil || u.Hostname() == "" || host == "" {
			return nil, bad("no host")
		}
		if err := sameUserinfo(u, b, hasUI); err != nil {
			return nil, bad("%v", err)
		}
		q := u.Query()
		if q.Has("max_retries") {
			// The client never re-sends on its own: a re-sent XADD whose
			// first reply was lost stores the entry twice, and a retry
			// outlives the relay's deadline; retries are the relay's.
			return nil, bad("max_retries is not honoured: the relay retries itself (a client retry can store an XADD twice)")
		}
		if q.Has("dial_timeout") {
			b.dialTimeout = o.DialTimeout
		}
		b.redis = o
		b.hosts = []string{o.Addr}
	}
	return b, nil
}

// sameUserinfo checks that url.Parse (which the RabbitMQ and Redis
// clients use) reads the user and password that splitUserinfo did: an
// unescaped '/', '?' or '#' in the password ends the authority early for
// url.Parse, which then takes part of the password for a host or port
// and the rest for the path (a connection elsewhere, with a vhost or
// database made of the password).
func sameUserinfo(u *url.URL, b *brokerURL, hasUI bool) error {
	if !hasUI && u.User == nil {
		return nil
	}
	pass, hasPass := "", false
	if u.User != nil {
		pass, hasPass = u.User.Password()
	}
	if !hasUI || u.User == nil || u.User.Username() != b.user || pass != b.password || hasPass != b.hasPassword {
		return errors.New("the user or password holds an unescaped '/', '?', '#' or '@': escape them as %2F, %3F, %23 and %40")
	}
	return nil
}

// urlErrorCause drops the URL a *url.Error repeats (it may hold the
// password).
func urlErrorCause(err error) error {
	var ue *url.Error
	if errors.As(err, &ue) {
		return ue.Err
	}
	return err
}

// scrub replaces every secret of at least 3 bytes in msg (shorter ones
// would mangle ordinary text) by xxxxx: everywhere if it has 8 bytes or
// more; a shorter one only where it is not part of a longer word (a
// letter or digit on an edge where the secret has one), so that a token
// "tok" blanks "nats://tok@host" but not the word "token". A URL's user
// name followed by its redacted password ("amqp://guest:xxxxx@") is kept
// even when the password is the same word (RabbitMQ's guest/guest): the
// user name is not the secret there.
func scrub(msg string, secrets []string) string {
	for _, s := range secrets {
		if len(s) < 3 {
			continue
		}
		user, mark := "://"+s+":"+redacted+"@", "://\x00user\x00:"+redacted+"@"
		msg = strings.ReplaceAll(msg, user, mark)
		if len(s) >= 8 {
			msg = strings.ReplaceAll(msg, s, redacted)
		} else {
			msg = replaceWord(msg, s)
		}
		msg = strings.ReplaceAll(msg, mark, user)
	}
	return msg
}

// replaceWord replaces s in msg by redacted where s is not glued to a
// letter or digit on a side where s itself begins or ends with one.
func replaceWord(msg, s string) string {
	var b strings.Builder
	for {
		i := strings.Index(msg, s)
		if i < 0 {
			b.WriteString(msg)
			return b.String()
		}
		end := i + len(s)
		glued := (i > 0 && alnum(s[0]) && alnum(msg[i-1])) || (end < len(msg) && alnum(s[len(s)-1]) && alnum(msg[end]))
		b.WriteString(msg[:i])
		if glued {
			b.WriteString(s[:1])
			msg = msg[i+1:]
			continue
		}
		b.WriteString(redacted)
		msg = msg[end:]
	}
}

// alnum reports whether c is an ASCII letter or digit.
func alnum(c byte) bool {
	return c >= '0' && c <= '9' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z'
}

// errBrokerSecretInArgv refuses a credential inside --broker on the
// command line; the URL is not shown.
var errBrokerSecretInArgv = errors.New("--broker holds a password or token: a password on the command line is visible to every user of the host; " +
	"give the URL in " + envBroker + " instead, or the password in --broker-password-file or " + envBrokerPassword)

// readSecretFile returns the content of a password file named by flag,
// less one trailing newline.
func readSecretFile(flag, path string) (string, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return "", fmt.Errorf("reading --%s: %w", flag, err)
	}
	return strings.TrimSuffix(strings.TrimSuffix(string(b), "\n"), "\r"), nil
}
