"""Operations: metrics, projection health, the live dashboard."""
