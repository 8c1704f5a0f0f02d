"""The daemon: run loop, the Lua action's control socket, the ensure path, live changes."""
