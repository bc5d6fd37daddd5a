"""The app's pages, one render() function each. Not named pages/: Streamlit treats that folder specially."""
