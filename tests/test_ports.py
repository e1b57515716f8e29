"""tests/ports.py: coordinator ports are never given to two tests of one run."""

import socket

import ports


def test_a_port_is_given_once_and_then_claimed():
  """Fails if free_port returns a port that is not bindable now, or one that claim() still
  hands out (a second test of the run would get it)."""
  port = ports.free_port()
  assert ports.bindable(port)
  assert not ports.claim(port)
  assert ports.free_port() != port


def test_a_port_the_os_offers_twice_is_skipped(monkeypatch):
  """Two tests asking at once can be offered the same port by bind(0): fails if the second
  free_port returns it instead of the next offer."""
  held = [ports.free_port()]  # claimed: what an earlier test of the run was given
  fresh = socket.socket()
  fresh.bind(("localhost", 0))
  offers = [held[0], fresh.getsockname()[1]]
  fresh.close()

  class OsOffering:
    """bind(('localhost', 0)) lands on the next offered port, as the OS would choose it."""

    def __init__(self):
      self.port = None

    def __enter__(self):
      return self

    def __exit__(self, *exc):
      return False

    def bind(self, address):
      self.port = offers.pop(0) if address[1] == 0 else address[1]

    def getsockname(self):
      return ("127.0.0.1", self.port)

  monkeypatch.setattr(ports.socket, "socket", OsOffering)
  assert ports.free_port() not in held
  assert not offers  # the repeated offer was refused and the next one taken
