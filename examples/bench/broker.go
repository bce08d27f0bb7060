package main

import (
	"bufio"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strings"
	"time"

	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/sqloutbox/outbox/outboxtest/kafkatest"
)

// brokerEnv makes the bench binary (or its test binary, see TestMain) run
// only the in-process Kafka-protocol broker: the bench re-executes itself
// with it so that the broker's memory and CPU are not the relay's.
const brokerEnv = "OUTBOX_BENCH_BROKER"

// brokerDelayEnv carries -broker-latency to the broker child.
const brokerDelayEnv = "OUTBOX_BENCH_BROKER_LATENCY"

// maybeRunBroker runs the broker and exits if this process was started as
// the bench's broker child. It prints the address on stdout and runs until
// stdin is closed (the parent exited or closed it).
func maybeRunBroker() {
	if os.Getenv(brokerEnv) == "" {
		return
	}
	b, err := kafkatest.Start()
	if err != nil {
		fmt.Fprintln(os.Stderr, "bench broker:", err)
		os.Exit(1)
	}
	if d, _ := time.ParseDuration(os.Getenv(brokerDelayEnv)); d > 0 {
		// Every produce request is answered d later; the broker serves
		// other requests meanwhile (SleepControl), as a remote broker
		// would (kfake's control functions).
		c := b.Cluster()
		c.ControlKey(int16(kmsg.Produce), func(kmsg.Request) (kmsg.Response, error, bool) {
			c.KeepControl()
			c.SleepControl(func() { time.Sleep(d) })
			return nil, nil, false
		})
	}
	fmt.Println(strings.Join(b.Addrs(), ","))
	_, _ = io.Copy(io.Discard, os.Stdin)
	b.Close()
	os.Exit(0)
}

// childBroker is a kfake broker in a child process of the bench.
type childBroker struct {
	cmd   *exec.Cmd
	stdin io.WriteCloser
	addrs []string
}

// startChildBroker starts the broker child; it answers produce requests
// delay late (0: at once).
func startChildBroker(delay time.Duration) (*childBroker, error) {
	cmd := exec.Command(os.Args[0])
	cmd.Env = append(os.Environ(), brokerEnv+"=1", brokerDelayEnv+"="+delay.String())
	cmd.Stderr = os.Stderr
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return nil, err
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("starting the broker child: %w", err)
	}
	line := make(chan string, 1)
	go func() {
		s := bufio.NewScanner(out)
		if s.Scan() {
			line <- s.Text()
		}
		close(line)
		_, _ = io.Copy(io.Discard, out)
	}()
	select {
	case l, ok := <-line:
		if !ok || l == "" {
			_ = stdin.Close()
			_ = cmd.Wait()
			return nil, fmt.Errorf("the broker child exited without an address")
		}
		return &childBroker{cmd: cmd, stdin: stdin, addrs: strings.Split(l, ",")}, nil
	case <-time.After(30 * time.Second):
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		return nil, fmt.Errorf("the broker child did not start within 30 s")
	}
}

func (b *childBroker) Close() {
	_ = b.stdin.Close()
	done := make(chan struct{})
	go func() { _ = b.cmd.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		_ = b.cmd.Process.Kill()
		<-done
	}
}
