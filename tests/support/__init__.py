"""What the test folders share: private servers (servers), client-side fakes and a cuttable proxy
(client_support), an in-process tubeq with its HTTP listener (http_support), a raw-protocol line
client (wire), and the guard that keeps the unit tests offline (offline). No tests here."""
