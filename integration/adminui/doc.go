// Package adminui holds the admin page's tests in a real browser
// (headless Chromium driven by chromedp): the page against PostgreSQL, a
// relay publishing to a Kafka-protocol broker (kfake) and an inbox
// runner consuming from it. Tests only.
package adminui
