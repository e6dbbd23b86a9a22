"""Who may call the server: the guard every request passes first (`guard.AccessGuard`) and the
named tokens with their roles (`tokens`). Below the API and the gateway, which both ask it."""
